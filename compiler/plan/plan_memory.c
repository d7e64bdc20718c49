/* plan_memory.c - the memory plan after fusion (plan.h, "the memory plan"): the regions, and for
 * each phase (step, update, logits) a slot for every buffer of its fused schedule and the moves
 * after its launches; their checks (plan_verify) and their listing (--emit=plan), with the summary
 * that `./prog info` prints back from the executable's descriptor.
 *
 * Fusion computes two things in place, and here they are buffers like any other: the classifier
 * kernel's gradient, which it gives the logits' buffer when the kernel is their last reader
 * (fuse.c's fz_ce_inplace, FuseBuffer.over), its life from the logits' GEMM to the gradient's last
 * reader; and the update's new parameters and state, written over their inputs in their regions
 * where the kernel reads each element before writing it (fz_update_in_place), so nothing is moved
 * for them. The step's kernels write each parameter's gradient to an arena buffer, and
 * forward_backward adds loss_scale x it into the gradient region right after the last launch that
 * touches that buffer (PlanWrite.after), whose life ends there: the seed of the backward is 1.0 and
 * the micro-batches accumulate, so a kernel writing the region itself would have to scale and add,
 * which the generated kernels do not. (Moved to the step's end, every gradient buffer would be live
 * at once there: with GPT-2 124M at 4 x 64 tokens that is the step's peak.) An update result that
 * cannot be written in place (fz_update_in_place says why) is an arena buffer copied into its
 * region after the last launch. A bf16 program's parameter casts are written in place too: no
 * kernel reads that region but the step's, so the update's cast(p_new) and the step's casts of
 * whole parameters go there (PH_PCAST; plan.h, pcast_bytes). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "graph_pad.h"
#include "plan_internal.h"

#define PLAN_LR_OFFSET 0 /* the update's lr slot, then t, in the arena's first PLAN_ALIGN bytes */
#define PLAN_T_OFFSET 4
#define PLAN_RNG_OFFSET 0 /* a step's dropout key (graph.h), in its phase's first PLAN_ALIGN bytes */

/* ---- the regions ------------------------------------------------------------------------------ */

/* offload.optimizer = nvme: the chunks the update streams the state in (PlanMemory.offload_*).
 * At least 8 chunks where the model allows, so that reading the next chunk and writing the last
 * back overlap the update of this one, and at most 2^20 parameters a chunk (8 MiB of AdamW's
 * state), which bounds the staging memory whatever the model; a multiple of 1024 parameters, so
 * that every part of a chunk's slot starts 4096-aligned when it is one variable (f32). */
#define PLAN_OFFLOAD_MAX_CHUNK ((int64_t)1 << 20)
#define PLAN_STORE_ALIGN 4096
static void plan_offload_optimizer(PlanCtx *c) {
    PlanMemory *m = &c->p->mem;
    int64_t n = m->state_part / 4;
    m->offload_host = c->ts->offload_optimizer == STORE_HOST && m->nstate > 0 && n > 0;
    if (c->ts->offload_optimizer != STORE_NVME || m->nstate == 0 || n == 0) return;
    int64_t chunk = (n + 7) / 8;
    chunk = (chunk + 1023) / 1024 * 1024;
    if (chunk > PLAN_OFFLOAD_MAX_CHUNK) chunk = PLAN_OFFLOAD_MAX_CHUNK;
    int64_t slot = ((int64_t)m->nstate * chunk * 4 + PLAN_STORE_ALIGN - 1) / PLAN_STORE_ALIGN * PLAN_STORE_ALIGN;
    m->offload_chunk = chunk;
    m->offload_nchunks = (n + chunk - 1) / chunk;
    m->store_bytes = m->offload_nchunks * slot;
    m->staging_bytes = 3 * slot;
}

/* Parameters, gradients and state: the update graph's layout, in bytes. */
static int plan_regions(PlanCtx *c) {
    Plan *p = c->p;
    PlanMemory *m = &p->mem;
    const Graph *g = p->step;
    const GraphUpdate *u = p->update->update;
    if (u->nsegs != g->nparams) INTERNAL("plan: %d segments for %d parameters", u->nsegs, g->nparams);
    m->param_bytes = plan_mul_bytes(u->n_params, 4);
    m->state_part = plan_mul_bytes(u->n, 4); /* the frozen parameters, past n, have no state */
    m->nstate = u->nstate;
    m->state_bytes = m->state_part < 0 ? -1 : plan_mul_bytes(m->state_part, u->nstate);
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
        m->params[i] = (PlanParam){pn->name, pn->id, graph_numel(pn), graph_param_numel(pn), u->seg_off[i] * 4};
    }
    if (u->cast_out >= 0) { /* the parameter casts' region: 2 bytes an element (PlanMemory.pcast_bytes) */
        m->pcast_dt = graph_node(p->update, u->cast_out)->dt;
        m->pcast_bytes = m->param_bytes / 2;
    }
    plan_offload_optimizer(c);
    return 1;
}

/* data.x and data.y: the runtime's batch buffers, each as large as the step's. */
static int plan_inputs(PlanCtx *c) {
    PlanMemory *m = &c->p->mem;
    const Graph *g = c->p->step;
    for (int id = 0; id < g->n; id++) {
        const GNode *n = g->node[id];
        if (n->op != G_INPUT || !n->name) continue;
        if (strcmp(n->name, GRAPH_RNG_NAME) == 0) continue; /* dropout's key: an arena slot (plan_phase) */
        if (strncmp(n->name, "stat.", 5) == 0) continue;    /* plan_stats */
        PlanHome home = strcmp(n->name, "data.x") == 0     ? PH_X
                        : strcmp(n->name, "data.y") == 0   ? PH_Y
                        : strcmp(n->name, "data.pos") == 0 ? PH_POS
                                                           : PH_NONE;
        if (home == PH_NONE || m->ninputs == 3) INTERNAL("plan: step input %%%d '%s'", id, n->name);
        int64_t bytes = plan_mul_bytes(graph_numel(n), dtype_size(n->dt));
        if (bytes < 0) {
            diag_error(c->at, "the memory plan: the inputs need more than 2^60 bytes, which is not supported");
            return 0;
        }
        m->inputs[m->ninputs++] = (PlanInput){n->name, home, id, bytes};
        m->input_bytes += bytes;
    }
    return 1;
}

/* global_mean's statistics: their offsets in the stats region (f32 each, one after another). */
static void plan_stats(PlanCtx *c) {
    PlanMemory *m = &c->p->mem;
    const Graph *g = c->p->step;
    m->nstats = g->nstats;
    m->stat_offset = arena_alloc(c->ar, sizeof(int64_t) * (size_t)(g->nstats + 1));
    for (int k = 0; k < g->nstats; k++) {
        m->stat_offset[k] = m->stat_bytes;
        m->stat_bytes += graph_numel(g->node[g->stat_in[k]]) * 4;
    }
    m->stats_last = -1;
}

/* forward_stats' launches: walking back from stats_last, a launch is kept when it writes a buffer
 * the statistics need, and then everything it reads is needed (a GEMM's C too when beta is not 0;
 * a kernel's every buffer, written ones included, as a kernel may load what it stores). */
static void plan_stats_keep(Arena *ar, const FuseResult *r, PlanMemory *m) {
    unsigned char *need = arena_alloc(ar, (size_t)r->nbuffers + 1);
    m->stats_keep = arena_alloc(ar, (size_t)r->nlaunches + 1);
    m->stats_launches = 0;
    for (int k = 0; k < m->nstats; k++) need[r->node_buffer[r->g->stat_expr[k]]] = 1;
    for (int l = m->stats_last; l >= 0; l--) {
        const FuseLaunch *L = &r->launches[l];
        int keep = 0;
        if (L->kind == FL_GEMM) {
            const FuseGemm *gm = &L->gemm;
            keep = need[gm->c] || (gm->epilogue == FE_BGRAD_B && gm->bias >= 0 && need[gm->bias]);
            if (keep) {
                need[gm->a] = need[gm->b] = 1;
                if (gm->bias >= 0) need[gm->bias] = 1;
                if (gm->beta != 0) need[gm->c] = 1;
            }
        } else {
            const Kernel *K = r->kernels[L->kernel];
            for (int i = 0; i < K->nbufs && !keep; i++) keep = K->bufs[i].written && need[K->bufs[i].buffer];
            for (int i = 0; keep && i < K->nbufs; i++) need[K->bufs[i].buffer] = 1;
        }
        m->stats_keep[l] = (unsigned char)keep;
        m->stats_launches += keep;
    }
}

/* ---- one phase -------------------------------------------------------------------------------- */

/* The plan's entry of parameter n of graph g (the step, logits or chunk graph): by its name, since
 * the graphs list their parameters in orders of their own (the step's follows the parameter groups'
 * layout, the chunk phase's its rewrite of the forward); -1 when none. */
static int plan_param_index(const PlanMemory *m, const GNode *n) {
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i].name && n->name && strcmp(m->params[i].name, n->name) == 0) return i;
    return -1;
}

/* The home of a leaf buffer (a parameter or an input) of the step or logits schedule. */
static void plan_leaf_forward(const PlanMemory *m, const Graph *g, const GNode *n, PlanSlot *s) {
    if (n->op == G_INPUT && n->name && strcmp(n->name, GRAPH_RNG_NAME) == 0) { /* in the reserved bytes */
        s->home = PH_ARENA;
        s->offset = PLAN_RNG_OFFSET;
        return;
    }
    if (n->op == G_PARAM) {
        int pi = plan_param_index(m, n);
        if (pi < 0) INTERNAL("plan: parameter %%%d is not in the graph's list", n->id);
        s->home = PH_PARAMS;
        s->offset = m->params[pi].offset;
        return;
    }
    for (int i = 0; i < m->ninputs; i++)
        if (n->op == G_INPUT && n->name && strcmp(n->name, m->inputs[i].name) == 0) s->home = m->inputs[i].home;
    for (int k = 0; k < g->nstats; k++)
        if (g->stat_in[k] == n->id) {
            s->home = PH_STATS;
            s->offset = m->stat_offset[k];
        }
    if (n->op == G_INPUT && n->name && strcmp(n->name, "kv") == 0) s->home = PH_KV; /* the chunk phase's */
    if (s->home == PH_NONE) INTERNAL("plan: leaf %%%d has no home", n->id);
}

/* The home of a leaf buffer of the update schedule: a region, or lr and t in the reserved slots. */
static void plan_leaf_update(const PlanMemory *m, const GraphUpdate *u, int node, PlanSlot *s) {
    if (node == u->p_in) s->home = PH_PARAMS;
    else if (node == u->g_in) s->home = PH_GRADS;
    else if (node == u->lr_in || node == u->t_in) {
        s->home = PH_ARENA;
        s->offset = node == u->lr_in ? m->lr_offset : m->t_offset;
    } else {
        for (int j = 0; j < u->nstate; j++)
            if (node == u->state_in[j]) {
                s->home = PH_STATE;
                s->offset = (int64_t)j * m->state_part;
            }
        if (s->home == PH_NONE) INTERNAL("plan: update input %%%d has no role", node);
    }
}

static void plan_add_write(Arena *ar, PlanPhaseMem *ph, PlanWrite w) {
    PlanWrite *nw = arena_alloc(ar, sizeof(PlanWrite) * (size_t)(ph->nwrites + 1));
    if (ph->nwrites) memcpy(nw, ph->writes, sizeof(PlanWrite) * (size_t)ph->nwrites);
    nw[ph->nwrites++] = w;
    ph->writes = nw;
}

/* The moves: each gradient added into its place (step: after the position plan_phase sets), each changed update
 * result copied into its region (update). */
static void plan_writes(PlanCtx *c, PlanPhase which, PlanPhaseMem *ph) {
    const PlanMemory *m = &c->p->mem;
    const FuseResult *r = ph->r;
    const Graph *g = r->g;
    if (which == PLAN_STEP) {
        for (int i = 0; i < g->nparams; i++) {
            int gb = g->grads && g->grads[i] >= 0 ? r->node_buffer[g->grads[i]] : -1;
            if (gb < 0) continue; /* no buffer: a zero gradient, nothing to add */
            plan_add_write(c->ar, ph,
                           (PlanWrite){arena_printf(c->ar, "grad %s", m->params[i].name), gb, PH_GRADS, m->params[i].offset,
                                       m->params[i].numel * 4, 1, -1});
        }
    } else if (which == PLAN_UPDATE) {
        const GraphUpdate *u = g->update;
        for (int k = 0; k <= u->nstate; k++) {
            int out = k == 0 ? u->p_out : u->state_out[k - 1], in = k == 0 ? u->p_in : u->state_in[k - 1];
            /* unchanged, or written over the old value (fuse.c's fz_update_in_place): nothing to move */
            if (out == in || r->node_buffer[out] < 0 || r->node_buffer[out] == r->node_buffer[in]) continue;
            plan_add_write(c->ar, ph,
                           (PlanWrite){k == 0 ? "p" : arena_printf(c->ar, "state.%s", u->state_name[k - 1]), r->node_buffer[out],
                                       k == 0 ? PH_PARAMS : PH_STATE, k == 0 ? 0 : (int64_t)(k - 1) * m->state_part,
                                       m->state_part, 0, 0});
        }
    }
}

static int64_t fb_bytes(const FuseResult *r, int i) { return r->buffers[i].bytes; }

/* The parameter whose whole cast step buffer b holds, in the parameter casts' region's dtype
 * (PlanMemory.pcast_bytes): its index in the plan's list, or -1. */
static int plan_pcast_param(const PlanMemory *m, const FuseResult *r, int b) {
    const FuseBuffer *fb = &r->buffers[b];
    if (m->pcast_bytes <= 0 || fb->node < 0 || fb->over >= 0 || fb->kind == FB_PARAM || fb->kind == FB_INPUT) return -1;
    const GNode *n = graph_node(r->g, fb->node);
    if (n->op != G_CAST || n->dt != m->pcast_dt || fb->dt != m->pcast_dt) return -1;
    const GNode *pn = graph_node(r->g, n->in[0]);
    if (pn->op != G_PARAM) return -1;
    int pi = plan_param_index(m, pn);
    if (pi < 0 || graph_numel(n) != m->params[pi].numel || fb->bytes != m->params[pi].numel * 2) return -1;
    return pi;
}

/* The step's launches that read only parameters (PlanMemory.param_only), and in keep[b] the
 * buffers they write: a kernel whose every buffer is a parameter it reads or one it writes that no
 * other launch writes and the schedule does not hand out (the loss, a statistic). Such a launch
 * computes the same bits from the same parameters at every micro-batch of a step; its buffers are
 * kept for the whole step so that forward_backward may skip it (RtStep.casts_kept); but a buffer
 * that holds a whole parameter's cast goes in the parameter casts' region (pcast[b], its parameter),
 * and a launch whose every output does is marked 2. */
static void plan_param_only(PlanCtx *c, const FuseResult *r, unsigned char *keep, int *pcast) {
    PlanMemory *m = &c->p->mem;
    int nb = r->nbuffers, nl = r->nlaunches;
    int *writers = calloc((size_t)nb + 1, sizeof(int));
    unsigned char *out = calloc((size_t)nb + 1, 1), *cand = calloc((size_t)nl + 1, 1);
    if (!writers || !out || !cand) INTERNAL("plan: out of memory");
    for (int k = 0; k < r->noutputs; k++)
        if (r->node_buffer[r->outputs[k]] >= 0) out[r->node_buffer[r->outputs[k]]] = 1;
    for (int li = 0; li < nl; li++) {
        int cap = r->launches[li].kind == FL_KERNEL ? r->kernels[r->launches[li].kernel]->nbufs : 4;
        int *bv = malloc(sizeof(int) * (size_t)(cap + 1));
        unsigned char *wv = malloc((size_t)cap + 1);
        if (!bv || !wv) INTERNAL("plan: out of memory");
        int n = plan_launch_bufs(r, li, bv, wv, cap), ok = r->launches[li].kind == FL_KERNEL, writes = 0;
        for (int i = 0; i < n; i++) {
            if (wv[i]) writers[bv[i]]++, writes++;
            else if (r->buffers[bv[i]].kind != FB_PARAM) ok = 0;
        }
        cand[li] = ok && writes > 0;
        free(bv), free(wv);
    }
    for (int li = 0; li < nl; li++) {
        if (!cand[li]) continue;
        int cap = r->kernels[r->launches[li].kernel]->nbufs;
        int *bv = malloc(sizeof(int) * (size_t)(cap + 1));
        unsigned char *wv = malloc((size_t)cap + 1);
        if (!bv || !wv) INTERNAL("plan: out of memory");
        int n = plan_launch_bufs(r, li, bv, wv, cap), ok = 1;
        for (int i = 0; i < n; i++)
            if (wv[i] && (writers[bv[i]] != 1 || out[bv[i]] || r->buffers[bv[i]].kind == FB_PARAM)) ok = 0;
        if (ok) {
            if (!m->param_only) m->param_only = arena_alloc(c->ar, (size_t)nl + 1);
            int all = 1; /* every buffer it writes in the parameter casts' region */
            m->nparam_only++;
            for (int i = 0; i < n; i++) {
                if (!wv[i]) continue;
                int pi = plan_pcast_param(m, r, bv[i]);
                if (pi >= 0 && pcast[bv[i]] < 0) pcast[bv[i]] = pi, m->npcast++, m->pcast_use += r->buffers[bv[i]].bytes;
                else if (pi < 0 && !keep[bv[i]]) keep[bv[i]] = 1, m->param_only_bytes += r->buffers[bv[i]].bytes;
                all &= pi >= 0;
            }
            m->param_only[li] = all ? 2 : 1;
            m->nparam_skip += all;
        }
        free(bv), free(wv);
    }
    free(writers), free(out), free(cand);
}

/* Every buffer of the phase's schedule: leaves in their regions, the rest in the arena by
 * liveness over the launches (after the reserved bytes). */
static void plan_phase(PlanCtx *c, const PlanSchedules *s, PlanPhase which) {
    PlanMemory *m = &c->p->mem;
    PlanPhaseMem *ph = &m->phase[which];
    static const char *const names[PLAN_NPHASES] = {"step", "update", "logits", "chunk"};
    ph->name = names[which];
    if ((int)which >= s->n) return;
    const FuseResult *r = ph->r = s->r[which];
    const Graph *g = r->g;
    ph->kernels = r->nkernels;
    ph->gemms = r->ngemms;
    ph->reserve = which == PLAN_UPDATE ? PLAN_ALIGN : 0;
    ph->rng_offset = -1;
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        const GNode *gn = fb->kind == FB_INPUT && fb->first >= 0 ? graph_node(g, fb->node) : NULL;
        if (gn && gn->name && strcmp(gn->name, GRAPH_RNG_NAME) == 0) {
            if (which == PLAN_UPDATE || fb->bytes != GRAPH_RNG_WORDS * 8) INTERNAL("plan: the %s phase's rng key", ph->name);
            ph->reserve = PLAN_ALIGN;
            ph->rng_offset = PLAN_RNG_OFFSET;
        }
    }
    ph->slots = arena_alloc(c->ar, sizeof(PlanSlot) * (size_t)(r->nbuffers + 1));
    Arena scratch = {0};
    PlanBuffer *pb = arena_alloc(&scratch, sizeof(PlanBuffer) * (size_t)(r->nbuffers + 1));
    /* the step's gradients are added into the gradient region right after the last launch that
     * touches each (early): their buffers' lives end there, not at the step's end (the loss and
     * the statistics' expressions, outputs read after the launches, live to the end) */
    unsigned char *early = arena_alloc(&scratch, (size_t)r->nbuffers + 1);
    int *last_touch = arena_alloc(&scratch, sizeof(int) * (size_t)(r->nbuffers + 1));
    unsigned char *kept = arena_alloc(&scratch, (size_t)r->nbuffers + 1);        /* live over the whole step */
    int *pcast = arena_alloc(&scratch, sizeof(int) * (size_t)(r->nbuffers + 1)); /* PH_PCAST: its parameter */
    for (int i = 0; i < r->nbuffers; i++) pcast[i] = -1;
    if (which == PLAN_STEP && !c->ts->recompute && !c->ts->offload_activations) plan_param_only(c, r, kept, pcast);
    const GraphUpdate *gu = which == PLAN_UPDATE ? g->update : NULL;
    int ucast = gu && gu->cast_out >= 0 ? r->node_buffer[gu->cast_out] : -1; /* the update's cast(p_new) */
    if (ucast >= 0 && (m->pcast_bytes <= 0 || r->buffers[ucast].bytes != gu->n * 2))
        INTERNAL("plan: the update's parameter casts (%" PRId64 " bytes) do not fit their region", r->buffers[ucast].bytes);
    if (which == PLAN_STEP) {
        plan_writes(c, which, ph);
        plan_last_touch(r, last_touch);
        for (int k = 0; k < ph->nwrites; k++) early[ph->writes[k].buffer] = 1;
        int lb = g->loss >= 0 ? r->node_buffer[g->loss] : -1;
        if (lb >= 0) early[lb] = 0;
        for (int k = 0; k < g->nstats; k++)
            if (r->node_buffer[g->stat_expr[k]] >= 0) early[r->node_buffer[g->stat_expr[k]]] = 0;
    }
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        PlanSlot *sl = &ph->slots[i];
        *sl = (PlanSlot){PH_NONE, 0, fb->bytes, fb->first, early[i] && fb->first >= 0 ? last_touch[i] : fb->last};
        if (kept[i]) sl->last = r->nlaunches - 1; /* kept for the step's later micro-batches */
        int leaf = fb->kind == FB_PARAM || fb->kind == FB_INPUT;
        pb[i] = (PlanBuffer){0, fb->first >= 0 ? fb->first : 0, 0, 0};
        pb[i].last = sl->last >= pb[i].first ? sl->last : pb[i].first;
        if (fb->first < 0) continue; /* no launch touches it */
        if (leaf && which == PLAN_UPDATE) plan_leaf_update(m, g->update, fb->node, sl);
        else if (leaf) plan_leaf_forward(m, g, graph_node(g, fb->node), sl);
        else if (pcast[i] >= 0 || i == ucast) {
            sl->home = PH_PCAST; /* written in its place in the parameter casts' region, not the arena */
            sl->offset = i == ucast ? 0 : m->params[pcast[i]].offset / 2;
        } else pb[i].size = fb->bytes;
    }
    ph->naive = plan_naive_bytes(pb, r->nbuffers, PLAN_ALIGN) + ph->reserve;
    ph->peak = plan_assign_offsets(pb, r->nbuffers, PLAN_ALIGN, &scratch) + ph->reserve;
    PlanRecompute *rc = &m->rc;
    if (which == PLAN_STEP && (c->ts->recompute || c->ts->offload_activations)) {
        /* the step with its re-runs and its activations' copies: the lives again, over its order */
        const Graph *sg = r->g;
        int lb = sg->loss >= 0 ? r->node_buffer[sg->loss] : -1;
        rc->mask = c->ts->recompute;
        rc->on = 1;
        rc->offload = (int)c->ts->offload_activations;
        rc->peak_without = ph->peak;
        plan_recompute(c, r, lb >= 0 ? r->buffers[lb].first : -1, m->stats_last, rc);
        plan_recompute_lives(r, rc, ph->slots, early);
        int n2 = r->nbuffers;
        PlanBuffer *pb2 = arena_alloc(&scratch, sizeof(PlanBuffer) * (size_t)(2 * n2 + 1));
        for (int pass = rc->offload ? 0 : 1; pass < 2; pass++) {
            /* pass 0 (offload): the peak with the re-runs alone; then the chosen buffers' copies */
            if (pass == 1 && rc->offload) plan_offload(c, r, rc, ph->slots);
            rc->held_kept = rc->held_recomputed = 0;
            for (int i = 0; i < n2; i++) {
                const PlanSlot *sl = &ph->slots[i];
                pb2[i] = (PlanBuffer){pb[i].size, sl->first >= 0 ? sl->first : 0, sl->last >= 0 ? sl->last : 0, 0};
                const PlanSlot *a = &rc->again[i];
                int offl = rc->off && rc->off[i] >= 0, second = rc->rerun[i] >= 0 || offl;
                /* an offloaded buffer's copies are read and written with O_DIRECT: each slot is a
                 * page longer than its whole pages, and starts its buffer at a page (below) */
                int64_t sz = offl ? plan_align_up(fb_bytes(r, i), PLAN_OFFLOAD_PAGE) + PLAN_OFFLOAD_PAGE : fb_bytes(r, i);
                if (offl) pb2[i].size = sz;
                pb2[n2 + i] = (PlanBuffer){second ? sz : 0, a->first >= 0 ? a->first : 0, a->last >= 0 ? a->last : 0, 0};
                if (rc->fate[i] == PF_KEPT) rc->held_kept += fb_bytes(r, i);
                if (rc->fate[i] == PF_RECOMP) rc->held_recomputed += fb_bytes(r, i);
            }
            ph->naive = plan_naive_bytes(pb2, 2 * n2, PLAN_ALIGN) + ph->reserve;
            ph->peak = plan_assign_offsets(pb2, 2 * n2, PLAN_ALIGN, &scratch) + ph->reserve;
            if (pass == 0) rc->peak_no_offload = ph->peak;
        }
        int64_t with_rc = rc->offload ? rc->peak_no_offload : ph->peak;
        if (rc->mask && with_rc > rc->peak_without) /* carried out as asked, and said */
            plan_note(c, arena_printf(c->ar,
                                      "recompute raises the step's peak from %" PRId64 " to %" PRId64
                                      " bytes: what its re-runs read is kept until they run (docs/memory.md)",
                                      rc->peak_without, with_rc));
        if (rc->offload && ph->peak > rc->peak_no_offload)
            plan_note(c, arena_printf(c->ar,
                                      "offload.activations raises the step's peak from %" PRId64 " to %" PRId64
                                      " bytes: the offsets by liveness place the copies worse (docs/memory.md)",
                                      rc->peak_no_offload, ph->peak));
        for (int i = 0; i < n2; i++) {
            int64_t page = rc->off && rc->off[i] >= 0 ? PLAN_OFFLOAD_PAGE : 1; /* the arena starts a page */
            pb[i].offset = plan_align_up(pb2[i].offset + ph->reserve, page) - ph->reserve;
            if (pb2[n2 + i].size) {
                rc->again[i].home = PH_ARENA;
                rc->again[i].offset = plan_align_up(pb2[n2 + i].offset + ph->reserve, page);
            }
        }
    }
    for (int i = 0; i < r->nbuffers; i++)
        if (pb[i].size) {
            ph->slots[i].home = PH_ARENA;
            ph->slots[i].offset = pb[i].offset + ph->reserve;
        }
    arena_free(&scratch);
    if (which == PLAN_STEP)
        for (int k = 0; k < ph->nwrites; k++) ph->writes[k].after = ph->slots[ph->writes[k].buffer].last;
    else plan_writes(c, which, ph);
}

int plan_memory(PlanCtx *c, const PlanSchedules *s) {
    PlanMemory *m = &c->p->mem;
    if (!plan_regions(c) || !plan_inputs(c)) return 0;
    plan_stats(c);
    m->lr_offset = PLAN_LR_OFFSET;
    m->t_offset = PLAN_T_OFFSET;
    int64_t total = 0;
    for (int k = 0; k < m->nstats; k++) { /* outputs of the step schedule (fuse_default_outputs): live to its end */
        const FuseResult *r = s->r[PLAN_STEP];
        int b = r->node_buffer[r->g->stat_expr[k]];
        if (b < 0 || r->buffers[b].first < 0) INTERNAL("plan: statistic %d's expression has no buffer", k);
        if (r->buffers[b].first > m->stats_last) m->stats_last = r->buffers[b].first;
    }
    for (int i = 0; i < PLAN_NPHASES; i++) {
        const FuseResult *r = i < s->n ? s->r[i] : NULL;
        for (int b = 0; r && b < r->nbuffers; b++) {
            total += plan_align_up(r->buffers[b].bytes, PLAN_ALIGN);
            if (r->buffers[b].bytes > PLAN_MAX_BYTES || total > PLAN_MAX_BYTES) {
                diag_error(c->at, "the memory plan: the activations need more than 2^60 bytes, which is not supported");
                return 0;
            }
        }
        plan_phase(c, s, (PlanPhase)i);
        if (m->phase[i].peak > m->arena_bytes) m->arena_bytes = m->phase[i].peak;
    }
    if (m->nstats > 0) plan_stats_keep(c->ar, s->r[PLAN_STEP], m);
    return 1;
}

/* ---- checks ----------------------------------------------------------------------------------- */

static int64_t plan_region_bytes(const Plan *p, PlanHome h) {
    const PlanMemory *m = &p->mem;
    switch (h) {
    case PH_PARAMS:
    case PH_GRADS: return m->param_bytes;
    case PH_STATE: return m->state_bytes;
    case PH_X:
    case PH_Y:
    case PH_POS:
        for (int i = 0; i < m->ninputs; i++)
            if (m->inputs[i].home == h) {
                /* the chunk phase's tokens share the input batch, which the runtime allocates for
                 * the larger of a micro-batch and a call's rows (rt_exec_open) */
                int64_t rows = h == PH_X && p->sched.n > PLAN_CHUNK ? p->sched.kv.rows * 4 : 0;
                return m->inputs[i].bytes > rows ? m->inputs[i].bytes : rows;
            }
        return 0;
    case PH_STATS: return m->stat_bytes;
    case PH_ARENA: return m->arena_bytes;
    case PH_KV: return p->sched.n > PLAN_CHUNK ? p->sched.chunk.meta_bytes : 0;
    case PH_PCAST: return m->pcast_bytes;
    case PH_NONE: return 0;
    }
    return 0;
}

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

/* Arena slots live together never share a byte: a sweep over time keeping the live slots sorted by
 * offset; each slot that becomes live is checked against its neighbours there (the live ones being
 * disjoint, those are the only candidates). O(n log n + n x live). */
static void plan_v_arena(PlanVerify *v, const PlanSlot *slots, int nslots, const char *what) {
    Arena scratch = {0};
    int n = 0;
    for (int i = 0; i < nslots; i++) n += slots[i].home == PH_ARENA && slots[i].bytes > 0;
    PlanOrder *starts = arena_alloc(&scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    PlanOrder *ends = arena_alloc(&scratch, sizeof(PlanOrder) * (size_t)(n + 1));
    int *live = arena_alloc(&scratch, sizeof(int) * (size_t)(n + 1)); /* slot ids by offset */
    int k = 0, nlive = 0, released = 0;
    for (int i = 0; i < nslots; i++)
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
            plan_v_fail(v, "%s buffers %d and %d are live together and share bytes", what, live[lo - 1], id);
        if (lo < nlive && a->offset + a->bytes > slots[live[lo]].offset)
            plan_v_fail(v, "%s buffers %d and %d are live together and share bytes", what, id, live[lo]);
        memmove(live + lo + 1, live + lo, sizeof(int) * (size_t)(nlive - lo));
        live[lo] = id;
        nlive++;
    }
    arena_free(&scratch);
}

/* One phase: every buffer a launch touches has a home; every slot and every move inside its
 * region, arena slots aligned, at or after the reserve, below the peak and disjoint while live. */
static void plan_v_phase(PlanVerify *v, const Plan *p, const PlanPhaseMem *ph) {
    const FuseResult *r = ph->r;
    for (int i = 0; i < r->nbuffers; i++) {
        const PlanSlot *s = &ph->slots[i];
        if (s->home == PH_NONE) {
            if (r->buffers[i].first >= 0) plan_v_fail(v, "%s buffer %d (%s) has no home", ph->name, i, r->buffers[i].what);
            continue;
        }
        if (s->offset < 0 || s->offset + s->bytes > plan_region_bytes(p, s->home))
            plan_v_fail(v, "%s buffer %d: %" PRId64 " bytes at %" PRId64 " leave their region", ph->name, i, s->bytes, s->offset);
        int reserved = s->home == PH_ARENA && s->offset < ph->reserve; /* the update's lr and t */
        if (reserved ? s->offset + s->bytes > ph->reserve : s->home == PH_ARENA && s->offset % PLAN_ALIGN != 0)
            plan_v_fail(v, "%s buffer %d at arena %" PRId64 " is not aligned or crosses the reserved bytes", ph->name, i,
                        s->offset);
        if (s->home == PH_ARENA && s->offset + s->bytes > ph->peak)
            plan_v_fail(v, "%s buffer %d ends past the peak %" PRId64, ph->name, i, ph->peak);
    }
    const PlanRecompute *rc = &p->mem.rc;
    if (ph == &p->mem.phase[PLAN_STEP] && rc->on) { /* the second copies of the re-runs' buffers too */
        int nb = r->nbuffers;
        PlanSlot *all = calloc((size_t)(2 * nb + 1), sizeof(PlanSlot));
        if (!all) INTERNAL("plan_verify: out of memory");
        memcpy(all, ph->slots, sizeof(PlanSlot) * (size_t)nb);
        for (int i = 0; i < nb; i++) {
            all[nb + i] = rc->again[i];
            const PlanSlot *a = &rc->again[i];
            if ((rc->rerun[i] >= 0 || (rc->off && rc->off[i] >= 0)) != (a->home == PH_ARENA && a->bytes > 0))
                plan_v_fail(v, "step buffer %d: a second copy without its re-run or read, or one of those without it", i);
            if (a->home == PH_ARENA &&
                (a->offset < ph->reserve || a->offset % PLAN_ALIGN != 0 || a->offset + a->bytes > ph->peak))
                plan_v_fail(v, "step buffer %d's second copy at arena %" PRId64 " is misplaced", i, a->offset);
            if (a->home == PH_ARENA && a->first <= ph->slots[i].last && ph->slots[i].home == PH_ARENA)
                plan_v_fail(v, "step buffer %d's second copy lives before its first copy dies", i);
        }
        plan_v_arena(v, all, 2 * nb, ph->name);
        free(all);
    } else plan_v_arena(v, ph->slots, r->nbuffers, ph->name);
    for (int i = 0; i < ph->nwrites; i++) {
        const PlanWrite *w = &ph->writes[i];
        if (ph == &p->mem.phase[PLAN_STEP] && w->buffer >= 0 && w->buffer < r->nbuffers && w->after < ph->slots[w->buffer].last)
            plan_v_fail(v, "step: %s moves buffer %d at position %d, before its last use at %d", w->what, w->buffer, w->after,
                        ph->slots[w->buffer].last);
        if (w->buffer < 0 || w->buffer >= r->nbuffers || ph->slots[w->buffer].bytes != w->bytes)
            plan_v_fail(v, "%s: %s moves a buffer of another size", ph->name, w->what);
        if (w->offset < 0 || w->offset % PLAN_ALIGN != 0 || w->offset + w->bytes > plan_region_bytes(p, w->to))
            plan_v_fail(v, "%s: %s (%" PRId64 " bytes at %" PRId64 ") leaves its region", ph->name, w->what, w->bytes, w->offset);
    }
    if (ph->peak > ph->naive) plan_v_fail(v, "%s: the peak exceeds its naive total", ph->name);
    for (int i = 0; i < r->nbuffers; i++) { /* the parameter casts' region: the update's cast(p_new), the step's casts */
        if (ph->slots[i].home != PH_PCAST) continue;
        const GraphUpdate *u = r->g->update;
        if (ph == &p->mem.phase[PLAN_UPDATE]
                ? !u || u->cast_out < 0 || r->node_buffer[u->cast_out] != i || ph->slots[i].offset != 0
                : ph != &p->mem.phase[PLAN_STEP] || plan_pcast_param(&p->mem, r, i) < 0)
            plan_v_fail(v, "%s buffer %d is in the parameter casts' region but is not a parameter's cast", ph->name, i);
    }
    if (ph == &p->mem.phase[PLAN_STEP] && p->mem.param_only) { /* PlanMemory.param_only: kept for the whole step */
        if (rc->on) plan_v_fail(v, "step: launches run once a step in a step program with re-runs or copies");
        for (int li = 0; li < r->nlaunches; li++) {
            if (!p->mem.param_only[li]) continue;
            if (r->launches[li].kind != FL_KERNEL) {
                plan_v_fail(v, "step launch %d runs once a step but is not a kernel", li);
                continue;
            }
            int cap = r->kernels[r->launches[li].kernel]->nbufs;
            int *bufs = malloc(sizeof(int) * (size_t)(cap + 1));
            unsigned char *wr = malloc((size_t)cap + 1);
            if (!bufs || !wr) INTERNAL("plan_verify: out of memory");
            int n = plan_launch_bufs(r, li, bufs, wr, cap), all = 1;
            for (int i = 0; i < n; i++) {
                const PlanSlot *s = &ph->slots[bufs[i]];
                if (!wr[i] && r->buffers[bufs[i]].kind != FB_PARAM)
                    plan_v_fail(v, "step launch %d runs once a step but reads buffer %d, not a parameter", li, bufs[i]);
                if (!wr[i]) continue;
                if (s->home == PH_PCAST) { /* a whole parameter's cast, at that parameter's offset / 2 */
                    int pi = plan_pcast_param(&p->mem, r, bufs[i]);
                    if (pi < 0 || s->offset != p->mem.params[pi].offset / 2 || s->bytes != p->mem.params[pi].numel * 2)
                        plan_v_fail(v,
                                    "step launch %d's buffer %d is in the parameter casts' region but not its parameter's cast",
                                    li, bufs[i]);
                } else if (s->home != PH_ARENA || s->first != li || s->last != r->nlaunches - 1) {
                    plan_v_fail(v, "step launch %d runs once a step but its buffer %d is not kept to the step's end", li,
                                bufs[i]);
                }
                all &= s->home == PH_PCAST;
            }
            if ((p->mem.param_only[li] == 2) != all)
                plan_v_fail(v,
                            "step launch %d is %sskipped at a step's first micro-batch, but %s its buffers are in the "
                            "parameter casts' region",
                            li, p->mem.param_only[li] == 2 ? "" : "not ", all ? "all" : "not all");
            free(bufs), free(wr);
        }
    }
}

void plan_verify_memory(PlanVerify *v, const Plan *p) {
    const PlanMemory *m = &p->mem;
    const GraphUpdate *u = p->update->update;
    if (m->param_bytes % PLAN_ALIGN != 0 || m->param_bytes != u->n_params * 4)
        plan_v_fail(v, "the parameter region (%" PRId64 " bytes) is not the update graph's %" PRId64 " values", m->param_bytes,
                    u->n_params);
    if (m->state_part % PLAN_ALIGN != 0 || m->state_part != u->n * 4 || m->state_part > m->param_bytes)
        plan_v_fail(v, "a state part (%" PRId64 " bytes) is not the update's %" PRId64 " values", m->state_part, u->n);
    int64_t end = 0;
    for (int i = 0; i < m->nparams; i++) {
        const PlanParam *q = &m->params[i];
        if (q->offset % PLAN_ALIGN != 0 || q->offset < end || q->offset - end >= PLAN_ALIGN || q->offset != u->seg_off[i] * 4)
            plan_v_fail(v, "parameter '%s' at %" PRId64 ": not the next aligned offset after %" PRId64, q->name, q->offset, end);
        end = q->offset + q->numel * 4;
    }
    if (end > m->param_bytes || m->param_bytes - end >= PLAN_ALIGN)
        plan_v_fail(v, "the parameter region is %" PRId64 " bytes for parameters ending at %" PRId64, m->param_bytes, end);
    if (m->state_bytes != m->state_part * m->nstate) plan_v_fail(v, "the state region is not one part per state variable");
    if (m->t_offset + 4 > PLAN_ALIGN || m->lr_offset + 4 > m->t_offset)
        plan_v_fail(v, "the update's lr and t slots are not in its reserved bytes");
    int64_t largest = 0;
    for (int i = 0; i < PLAN_NPHASES; i++) {
        if (!m->phase[i].r) continue;
        plan_v_phase(v, p, &m->phase[i]);
        if (m->phase[i].peak > largest) largest = m->phase[i].peak;
    }
    if (!m->phase[PLAN_STEP].r || !m->phase[PLAN_UPDATE].r) plan_v_fail(v, "a step or update phase is missing");
    if (m->arena_bytes != largest) plan_v_fail(v, "the arena (%" PRId64 ") is not the largest peak", m->arena_bytes);
    plan_verify_gather(v, p);
}

/* ---- --emit=plan ------------------------------------------------------------------------------ */

static const char *plan_home_name(PlanHome h) {
    switch (h) {
    case PH_NONE: return "none";
    case PH_PARAMS: return "parameters";
    case PH_GRADS: return "gradients";
    case PH_STATE: return "state";
    case PH_X: return "data.x";
    case PH_Y: return "data.y";
    case PH_POS: return "data.pos";
    case PH_STATS: return "stats";
    case PH_ARENA: return "arena";
    case PH_KV: return "kv";
    case PH_PCAST: return "pcasts";
    }
    return "?";
}

/* "f32[2, 4, 8]" */
static const char *plan_type(Arena *ar, DType dt, int rank, const int64_t *shape) {
    const char *out = arena_printf(ar, "%s[", dtype_name(dt));
    for (int i = 0; i < rank; i++) out = arena_printf(ar, "%s%s%" PRId64, out, i ? ", " : "", shape[i]);
    return arena_printf(ar, "%s]", out);
}

static void plan_print_regions(FILE *out, Arena *ar, const Plan *p) {
    const PlanMemory *m = &p->mem;
    const Graph *g = p->step;
    const PlanPhaseMem *st = &m->phase[PLAN_STEP];
    fprintf(out, "\n## regions (bytes; every offset a multiple of %d)\n", PLAN_ALIGN);
    fprintf(out,
            "parameters %" PRId64 ", gradients %" PRId64 ", optimizer state %" PRId64 " (%d x %" PRId64 "), inputs %" PRId64
            ", arena %" PRId64 "\n",
            m->param_bytes, m->param_bytes, m->state_bytes, m->nstate, m->state_part, m->input_bytes, m->arena_bytes);
    if (m->pcast_bytes > 0)
        fprintf(out,
                "parameter casts %" PRId64 " (%s, element i of the parameters at byte 2i): written by the update, read by "
                "the step (%d buffer%s, %" PRId64 " bytes)\n",
                m->pcast_bytes, dtype_name(m->pcast_dt), m->npcast, m->npcast == 1 ? "" : "s", m->pcast_use);
    int w = 9;
    for (int i = 0; i < m->nparams; i++) {
        int len = (int)strlen(m->params[i].name ? m->params[i].name : "?");
        if (len > w) w = len;
    }
    fprintf(out, "%-*s  %-16s  %12s  %12s  gradient\n", w, "parameter", "type", "bytes", "offset");
    for (int i = 0; i < m->nparams; i++) {
        const PlanParam *q = &m->params[i];
        const GNode *n = graph_node(g, q->node);
        const char *how =
            graph_node(g, q->node)->iattr[1] & GP_FROZEN ? "none (frozen: no gradient, no state)" : "zero (no buffer holds it)";
        for (int k = 0; k < st->nwrites; k++)
            if (st->writes[k].offset == q->offset && st->writes[k].to == PH_GRADS)
                how = arena_printf(ar, "added from step buffer %d", st->writes[k].buffer);
        fprintf(out, "%-*s  %-16s  %12" PRId64 "  %12" PRId64 "  %s", w, q->name ? q->name : "?",
                plan_type(ar, n->dt, n->rank, n->shape), q->numel * 4, q->offset, how);
        if (q->valid != q->numel) /* graph_pad.h: the program's rows first, then zero rows */
            fprintf(out, "; padded from %" PRId64 " rows", graph_param_rows(n));
        fprintf(out, "\n");
    }
    for (int i = 0; i < m->nstate; i++)
        fprintf(out, "state.%s: the state region from %" PRId64 ", each %sparameter at its offset above\n",
                p->update->update->state_name[i], (int64_t)i * m->state_part, m->state_part < m->param_bytes ? "trained " : "");
    fprintf(out, "%-*s  %-16s  %12s\n", w, "input", "type", "bytes");
    for (int i = 0; i < m->ninputs; i++) {
        const GNode *n = graph_node(g, m->inputs[i].node);
        fprintf(out, "%-*s  %-16s  %12" PRId64 "  (the runtime's %s batch buffer)\n", w, m->inputs[i].name,
                plan_type(ar, n->dt, n->rank, n->shape), m->inputs[i].bytes,
                m->inputs[i].home == PH_X   ? "input"
                : m->inputs[i].home == PH_Y ? "target"
                                            : "position");
    }
}

/* The step's re-runs (recompute = [...]): what each held buffer became, the second copies, and
 * each re-run with where it goes. */
static void plan_print_recompute(FILE *out, Arena *ar, const Plan *p, const char *const *label, int w) {
    const PlanPhaseMem *ph = &p->mem.phase[PLAN_STEP];
    const PlanRecompute *rc = &p->mem.rc;
    const FuseResult *r = ph->r;
    static const char *const kw[] = {"gelu", "layernorm", "attention", "mlp", "all"};
    const char *list = "";
    for (int k = 0; k < 5; k++)
        if (rc->mask & (1u << k)) list = arena_printf(ar, "%s%s%s", list, *list ? ", " : "", kw[k]);
    int kept = 0, recomp = 0;
    for (int i = 0; i < r->nbuffers; i++) kept += rc->fate[i] == PF_KEPT, recomp += rc->fate[i] == PF_RECOMP;
    if (rc->offload) {
        static const char *const where[] = {"", "host", "nvme"};
        int64_t without = rc->mask ? rc->peak_no_offload : rc->peak_without;
        fprintf(out,
                "\n### offload activations = %s: %d held buffer%s offloaded (%s) to %s of %s; %d kept (%s), %d "
                "recomputed (%s)\n",
                where[rc->offload], rc->noffloads, rc->noffloads == 1 ? "" : "s", plan_bytes_text(ar, rc->held_offloaded),
                rc->offload == STORE_HOST ? "pinned host memory" : "a store file", plan_bytes_text(ar, rc->store_bytes), kept,
                plan_bytes_text(ar, rc->held_kept), recomp, plan_bytes_text(ar, rc->held_recomputed));
        fprintf(out, "step peak %s, without offload %s", plan_bytes_text(ar, ph->peak), plan_bytes_text(ar, without));
        if (without > 0)
            fprintf(out, " (%s%.1f%%)", ph->peak <= without ? "saves " : "costs ",
                    100.0 * (double)(ph->peak <= without ? without - ph->peak : ph->peak - without) / (double)without);
        if (rc->offload != STORE_HOST && rc->gpu) /* two legs in series: 0.95 GB/s is not 1.0 */
            fprintf(out,
                    "\nthe copies' times assume a store through pinned staging on a second stream (device to staging, "
                    "then staging to the store, one after the other) of %.2f GB/s",
                    rc->store_bw / 1e9);
        else
            fprintf(out, "\nthe copies' times assume %s of %.1f GB/s",
                    rc->offload == STORE_HOST ? "copies to host memory (on a second stream)" : "a store", rc->store_bw / 1e9);
        fprintf(out,
                " and launches that touch their buffers at %.1f GB/s: a write is waited for k launches after its last "
                "forward use, a read issued k launches before its first backward use, k the fewest launches whose time "
                "covers the copy\n",
                rc->launch_bw / 1e9);
        for (int j = 0; j < rc->noffloads; j++) {
            const PlanOffload *o = &rc->offloads[j];
            fprintf(out,
                    "offload %d: buffer %d (%" PRId64 " bytes) at store %" PRId64 ": written after position %d, waited before "
                    "%d (k = %d); read before position %d, waited before %d (k = %d)\n",
                    j, o->buffer, o->bytes, o->store_off, o->write_after, o->write_wait, o->write_wait - o->write_after - 1,
                    o->read_at, o->use, o->use - o->read_at);
        }
        if (!rc->mask) goto table;
    }
    fprintf(out,
            "\n### recompute [%s]: %d re-run%s; held buffers (forward values the backward reads): %d kept (%s), %d recomputed "
            "(%s)\n",
            list, rc->nreruns, rc->nreruns == 1 ? "" : "s", kept, plan_bytes_text(ar, rc->held_kept), recomp,
            plan_bytes_text(ar, rc->held_recomputed));
    fprintf(out, "step peak %s, without recompute%s %s", plan_bytes_text(ar, ph->peak), rc->offload ? " and offload" : "",
            plan_bytes_text(ar, rc->peak_without));
    if (rc->peak_without > 0)
        fprintf(out, " (%s%.1f%%)", ph->peak <= rc->peak_without ? "saves " : "costs ",
                100.0 * (double)(ph->peak <= rc->peak_without ? rc->peak_without - ph->peak : ph->peak - rc->peak_without) /
                    (double)rc->peak_without);
    fprintf(out,
            "\nthe step program: launches 0..%d, then each re-run just before the launch named; the launches column above "
            "counts positions in it (%d in all)\n",
            r->nlaunches - 1, rc->norder);
    for (int j = 0; j < rc->nreruns; j++) {
        const PlanRerun *re = &rc->reruns[j];
        const FuseLaunch *L = &r->launches[re->launch];
        int pos = 0;
        while (pos < rc->norder && rc->order[pos] != -1 - j) pos++;
        fprintf(out, "re-run %d: launch %d (%s) again at position %d, before launch %d: %s\n", j, re->launch,
                L->kind == FL_GEMM ? "GEMM" : r->kernels[L->kernel]->name, pos, re->before, re->why);
    }
table:;
    static const char *const fate[] = {"", "kept", "recomputed", "re-made for a re-run", "kept for a re-run", "offloaded"};
    fprintf(out, "%-*s  %12s  %-10s  %12s  launches  fate\n", w, "buffer", "bytes", "home", "offset");
    for (int i = 0; i < r->nbuffers; i++) {
        if (rc->fate[i] == PF_NONE) continue;
        const PlanSlot *s = &ph->slots[i];
        fprintf(out, "%-*s  %12" PRId64 "  %-10s  %12" PRId64 "  %d..%d  %s", w, label[i], s->bytes, "arena", s->offset, s->first,
                s->last, fate[rc->fate[i]]);
        if (rc->rerun[i] >= 0) {
            const PlanSlot *a = &rc->again[i];
            fprintf(out, " by re-run %d (launch %d): again at arena %" PRId64 ", %d..%d", rc->rerun[i],
                    rc->reruns[rc->rerun[i]].launch, a->offset, a->first, a->last);
        }
        if (rc->off && rc->off[i] >= 0) {
            const PlanSlot *a = &rc->again[i];
            fprintf(out, " as offload %d: read back at arena %" PRId64 ", %d..%d", rc->off[i], a->offset, a->first, a->last);
        }
        fprintf(out, "\n");
    }
}

/* The update's results written over their inputs (fuse.c's fz_update_in_place), and why any other
 * is copied. */
static void plan_print_in_place(FILE *out, const FuseResult *r) {
    const GraphUpdate *u = r->g->update;
    for (int j = 0; j <= u->nstate; j++) {
        int in = j == 0 ? u->p_in : u->state_in[j - 1], o = j == 0 ? u->p_out : u->state_out[j - 1];
        int b = r->node_buffer[in];
        if (o == in || b < 0 || r->node_buffer[o] != b) continue;
        fprintf(out, "in place: %s%s = %%%d written over buffer %d by launch %d, each element after it is read: no copy\n",
                j == 0 ? "p" : "state.", j == 0 ? "" : u->state_name[j - 1], o, b, r->buffers[b].over);
    }
    if (r->not_in_place) fprintf(out, "copied, not in place: %s\n", r->not_in_place);
}

static void plan_print_phase(FILE *out, Arena *ar, const Plan *p, PlanPhase which) {
    static const char *const fns[PLAN_NPHASES] = {"forward_backward, and forward_loss up to the loss", "optimizer_update",
                                                  "forward_logits, batch 1", "forward_chunk, new tokens with the KV cache"};
    const PlanPhaseMem *ph = &p->mem.phase[which];
    if (!ph->r) {
        const char *why = which == PLAN_CHUNK ? p->sched.why_no_chunk : p->sched.why_no_logits;
        fprintf(out, "\n## phase %s: none (%s)\n", ph->name, why ? why : "?");
        return;
    }
    const FuseResult *r = ph->r;
    int nb = 0;
    for (int i = 0; i < r->nbuffers; i++) nb += ph->slots[i].home == PH_ARENA && ph->slots[i].offset >= ph->reserve;
    fprintf(out, "\n## phase %s (%s): %d kernel%s, %d GEMM%s; arena %d buffer%s, peak %s, without reuse %s", ph->name, fns[which],
            ph->kernels, ph->kernels == 1 ? "" : "s", ph->gemms, ph->gemms == 1 ? "" : "s", nb, nb == 1 ? "" : "s",
            plan_bytes_text(ar, ph->peak), plan_bytes_text(ar, ph->naive));
    if (ph->naive > 0) fprintf(out, " (saves %.1f%%)", 100.0 * (double)(ph->naive - ph->peak) / (double)ph->naive);
    fprintf(out, "\n");
    if (which == PLAN_STEP && p->mem.nstats > 0)
        fprintf(out,
                "stats: %d global_mean statistic%s, %" PRId64 " bytes (RtStep.stats); forward_stats runs %d of launches "
                "0..%d (what they need) and copies them to RtStep.stats_out\n",
                p->mem.nstats, p->mem.nstats == 1 ? "" : "s", p->mem.stat_bytes, p->mem.stats_launches, p->mem.stats_last);
    for (int kind = 2; which == PLAN_STEP && kind >= 1 && p->mem.nparam_only > 0; kind--) {
        int n = kind == 2 ? p->mem.nparam_skip : p->mem.nparam_only - p->mem.nparam_skip;
        if (n == 0) continue;
        fprintf(out, "once a step: launch%s", n == 1 ? "" : "es");
        for (int li = 0, k = 0; li < r->nlaunches; li++)
            if (p->mem.param_only[li] == kind) fprintf(out, "%s %d", k++ ? "," : "", li);
        if (kind == 2) /* PlanMemory.pcast_bytes */
            fprintf(out,
                    " read%s only parameters and write%s only their casts, %s in the parameter casts' region: run when "
                    "RtStep.casts_kept is 0 (the region not current: the update writes it, other writers of the "
                    "parameters do not)\n",
                    n == 1 ? "s" : "", n == 1 ? "s" : "", plan_bytes_text(ar, p->mem.pcast_use));
        else
            fprintf(out,
                    " read%s only parameters: run when RtStep.casts_kept is not 1 (a step's first micro-batch); what %s "
                    "write%s, %s in the arena%s, kept there to the step's end\n",
                    n == 1 ? "s" : "", n == 1 ? "it" : "they", n == 1 ? "s" : "", plan_bytes_text(ar, p->mem.param_only_bytes),
                    p->mem.npcast ? " (and parameters' casts in their region)" : "");
    }
    if (which == PLAN_CHUNK) {
        const PlanSchedules *s = &p->sched;
        fprintf(out,
                "kv cache: %" PRId64 " new tokens a call (batch.tokens %" PRId64 ", at most %d); blocks of %" PRId64
                " tokens, %" PRId64 " a sequence; %s; %d layer%s of %" PRId64 " key/value heads of %" PRId64 "; %" PRId64
                " bytes a position in the pool (RtStep.kv_pool); the kv input holds %" PRId64 " bytes of metadata\n",
                s->kv.rows, s->kv.tokens, PLAN_KV_ROWS_MAX, s->kv.block, s->kv.max_blocks, dtype_name(s->kv.kv_dt),
                s->chunk.layers, s->chunk.layers == 1 ? "" : "s", s->chunk.heads_kv, s->chunk.head_dim, s->chunk.bytes_per_token,
                s->chunk.meta_bytes);
    }
    if (which == PLAN_UPDATE)
        fprintf(out,
                "lr and t: f32 at arena %" PRId64 " and %" PRId64 ", written by optimizer_update; buffers from %" PRId64 "\n",
                p->mem.lr_offset, p->mem.t_offset, ph->reserve);
    if (ph->rng_offset >= 0)
        fprintf(out,
                "dropout's key: i64[%d] at arena %" PRId64 " (seed, step, micro-batch, on), written by %s; buffers from %" PRId64
                "\n",
                GRAPH_RNG_WORDS, ph->rng_offset, which == PLAN_STEP ? "forward_backward and forward_loss" : "forward_logits",
                ph->reserve);
    int w = 6;
    const char **label = arena_alloc(ar, sizeof(char *) * (size_t)(r->nbuffers + 1));
    for (int i = 0; i < r->nbuffers; i++) {
        const FuseBuffer *fb = &r->buffers[i];
        label[i] = arena_printf(ar, "%d %s %s", i, fb->what ? fb->what : "?", plan_type(ar, fb->dt, fb->rank, fb->shape));
        int len = (int)strlen(label[i]);
        if (len > w) w = len;
    }
    fprintf(out, "%-*s  %12s  %-10s  %12s  launches\n", w, "buffer", "bytes", "home", "offset");
    for (int i = 0; i < r->nbuffers; i++) {
        const PlanSlot *s = &ph->slots[i];
        if (s->home == PH_NONE) fprintf(out, "%-*s  %12" PRId64 "  none (no launch touches it)\n", w, label[i], s->bytes);
        else
            fprintf(out, "%-*s  %12" PRId64 "  %-10s  %12" PRId64 "  %d..%d\n", w, label[i], s->bytes, plan_home_name(s->home),
                    s->offset, s->first, s->last);
    }
    if (which == PLAN_STEP && p->mem.rc.on) plan_print_recompute(out, ar, p, label, w);
    for (int i = 0; i < ph->nwrites; i++) {
        const PlanWrite *wr = &ph->writes[i];
        const char *when = which == PLAN_STEP ? arena_printf(ar, "after %s %d", p->mem.rc.on ? "position" : "launch", wr->after)
                                              : "after the launches";
        fprintf(out, "%s: %s %s buffer %d into the %s region at %" PRId64 " (%" PRId64 " bytes)\n", when, wr->what,
                wr->accumulate ? "+= loss_scale x" : "= (copied from)", wr->buffer, plan_home_name(wr->to), wr->offset,
                wr->bytes);
    }
    if (which == PLAN_UPDATE) plan_print_in_place(out, r);
    if (which == PLAN_CHUNK) { /* its launches and kernels: --emit=kernels and --emit=llvm come before the plan */
        fprintf(out, "\n### the chunk phase's launches and kernels (chunk_ in --emit=program)\n");
        fuse_print(out, r);
    }
}

void plan_print_memory(FILE *out, Arena *ar, const Plan *p) {
    plan_print_regions(out, ar, p);
    for (int i = 0; i < PLAN_NPHASES; i++) plan_print_phase(out, ar, p, (PlanPhase)i);
    if (p->config && p->config->zero == 3) plan_print_gather(out, p);
    fprintf(out, "\n## summary (`./prog info` prints the same lines from the executable)\n");
    plan_print_summary(out, p);
}

/* The summary. runtime/cli/info.c prints the same lines from the descriptor: keep the two alike. */
void plan_print_summary(FILE *out, const Plan *p) {
    const PlanMemory *m = &p->mem;
    static const char *const call[PLAN_NPHASES] = {"micro-batch (forward and backward)", "update", "logits call", "chunk call"};
    for (int i = 0; i < PLAN_NPHASES; i++) fprintf(out, "plan: arena %s %" PRId64 " bytes\n", m->phase[i].name, m->phase[i].peak);
    fprintf(out, "plan: arena %" PRId64 " bytes, the largest\n", m->arena_bytes);
    /* the optimizer state in memory: the staging buffers when it lives in a store file */
    fprintf(out,
            "plan: parameters %" PRId64 " bytes, gradients %" PRId64 " bytes, optimizer state %" PRId64 " bytes, inputs %" PRId64
            " bytes\n",
            m->param_bytes, m->param_bytes,
            m->offload_chunk  ? m->staging_bytes
            : m->offload_host ? 0
                              : m->state_bytes,
            m->input_bytes);
    if (m->pcast_bytes > 0) /* runtime/cli/info.c prints it back from RtProgram.pcast_bytes */
        fprintf(out, "plan: parameter casts %" PRId64 " bytes, written by the update, read by the step\n", m->pcast_bytes);
    if (m->offload_host)
        fprintf(out,
                "plan: optimizer state offloaded to host: %" PRId64 " bytes in host memory, updated there by the CPU (the "
                "gradients copied down, the parameters up, each step)\n",
                m->state_bytes);
    if (m->offload_chunk)
        fprintf(out,
                "plan: optimizer state offloaded to nvme: %" PRId64 " bytes in a store file, %" PRId64 " chunks of %" PRId64
                " parameters streamed through 3 staging buffers (%" PRId64 " bytes in memory)\n",
                m->store_bytes, m->offload_nchunks, m->offload_chunk, m->staging_bytes);
    if (p->config && p->config->zero == 3) plan_print_gather_summary(out, p);
    for (int i = 0; i < PLAN_NPHASES; i++)
        fprintf(out, "plan: per %s %d kernels, %d GEMMs\n", call[i], m->phase[i].kernels, m->phase[i].gemms);
    if (p->sched.n > PLAN_CHUNK) fprintf(out, "plan: a chunk call takes up to %" PRId64 " new tokens\n", p->sched.kv.rows);
    for (int k = 0; k < p->nprograms; k++) {
        const PlanProgram *pr = &p->programs[k];
        int64_t nmicro = pr->accumulation * pr->data;
        fprintf(out,
                "plan: per optimizer step from step %" PRId64 " (%" PRId64 " micro-batches and the update) %" PRId64
                " kernels, %" PRId64 " GEMMs\n",
                pr->first_step, nmicro, nmicro * m->phase[PLAN_STEP].kernels + m->phase[PLAN_UPDATE].kernels,
                nmicro * m->phase[PLAN_STEP].gemms + m->phase[PLAN_UPDATE].gemms);
    }
}
