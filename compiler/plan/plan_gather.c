/* plan_gather.c - ZeRO-3's gather schedules (plan.h, PlanGather; docs/parallel.md, "ZeRO-3").
 *
 * With parallel { zero = 3 } a rank keeps its shard of the parameter region alone; the rest of a
 * parameter is gathered from the other ranks before a launch reads it and released after. The
 * schedules are the plan's, one for each generated function that reads the parameters: the step
 * program (forward_backward, recompute's re-runs included), the launches up to the loss
 * (forward_loss, evaluation) and those forward_stats runs (global_mean's pass). Each comes from
 * its launches' reads: the parameter buffers' ranges of the region, merged where they overlap into
 * disjoint units and grouped with their neighbours up to PLAN_GATHER_GROUP floats; in the step
 * program a unit's uses split at the loss (the forward's and the backward's); each part one
 * gather, needed at its first use and released after its last. The runtime starts gather k + 1
 * (on a thread of its own) when gather k is needed, so one gather is in flight while the launches
 * use the ones before it.
 *
 * A gather's prefetch must not overlap the release of the same unit (the release would drop pages
 * the prefetch has filled): where gather k + 1 is the unit's backward part and its forward part is
 * released at or after gather k's need, the two parts are one gather (kept from the forward's first
 * use to the backward's last).
 *
 * The window is the most floats the gathers hold at once: gather k from its post (gather k - 1's
 * need) to its release; and the most pages (the target's, PlanMemory.gather_page) they cover at
 * once, a page counted once however many held gathers share it. A rank's parameter memory is then
 * at most the pages of its shard plus the window's pages: the runtime maps (the GPU) or keeps
 * resident (the CPU) a page while a gather holding a float of it is held, and its shard's always.
 *
 * The grouping takes the page: neighbouring units are one gather while the group spans at most a
 * page (or PLAN_GATHER_GROUP floats where that is more, the CPU's 4 KiB pages), so that on a GPU's
 * 2 MiB page a gather is not a sliver of a page shared with its neighbours, each its own map and
 * collective. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "plan_internal.h"

#define PLAN_SHARD_ALIGN 16384 /* runtime/cli/train_internal.h, RT_SHARD_ALIGN */
#define PLAN_GATHER_GROUP 4096 /* floats: the span up to which neighbouring units are one gather */

typedef struct Unit {
    int64_t lo, hi;
} Unit;

static int unit_cmp(const void *a, const void *b) {
    const Unit *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : (x->hi > y->hi) - (x->hi < y->hi);
}

static int gather_cmp(const void *a, const void *b) {
    const PlanGather *x = a, *y = b;
    if (x->need != y->need) return x->need < y->need ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The positions of one program and the launch at each (-1: none runs there), and where its
 * forward ends (the last position whose uses are the forward's; n - 1: one part). */
typedef struct Prog {
    int n, split;
    int *launch;
} Prog;

static Prog program_of(const Plan *p, int which, Arena *ar) {
    const PlanMemory *m = &p->mem;
    const PlanPhaseMem *ph = &m->phase[PLAN_STEP];
    const PlanRecompute *rc = &m->rc;
    const FuseResult *r = ph->r;
    Prog g = {0, -1, NULL};
    const Graph *sg = r->g;
    int lb = sg->loss >= 0 ? r->node_buffer[sg->loss] : -1, loss = lb >= 0 ? r->buffers[lb].first : r->nlaunches - 1;
    if (which == PLAN_GATHER_STEP) g.n = rc->on ? rc->norder : r->nlaunches;
    else if (which == PLAN_GATHER_LOSS) g.n = loss >= 0 ? loss + 1 : 0;
    else g.n = m->nstats > 0 && m->stats_keep ? m->stats_last + 1 : 0;
    g.launch = arena_alloc(ar, sizeof(int) * (size_t)(g.n + 1));
    for (int q = 0; q < g.n; q++) {
        int o = which == PLAN_GATHER_STEP && rc->on ? rc->order[q] : q;
        g.launch[q] = o >= 0 ? o : rc->reruns[-1 - o].launch;
        if (which == PLAN_GATHER_STEP && o == loss) g.split = q;
        if (which == PLAN_GATHER_STATS && !m->stats_keep[q]) g.launch[q] = -1;
    }
    if (g.split < 0) g.split = g.n - 1;
    return g;
}

/* One stamp a page of the region (-1: none yet), for counting the pages held at a position once. */
static int *gather_stamps(const PlanMemory *m, Arena *ar) {
    int64_t np = (m->param_bytes + m->gather_page - 1) / m->gather_page + 1;
    int *stamp = arena_alloc(ar, sizeof(int) * (size_t)np);
    for (int64_t i = 0; i < np; i++) stamp[i] = -1;
    return stamp;
}

/* The pages of g's range not yet stamped q (then stamped): what g adds to position q's pages. */
static int64_t gather_pages(const PlanGather *g, int64_t page, int *stamp, int q) {
    int64_t n = 0;
    for (int64_t pg = g->lo * 4 / page; pg < (g->hi * 4 + page - 1) / page; pg++)
        if (stamp[pg] != q) stamp[pg] = q, n++;
    return n;
}

static void build(PlanCtx *c, int which, const Unit *u, int nu, const int *unit_of, Arena *scratch) {
    PlanMemory *m = &c->p->mem;
    PlanGatherSched *out = &m->gather[which];
    const FuseResult *r = m->phase[PLAN_STEP].r;
    int nb = r->nbuffers;
    Prog pg = program_of(c->p, which, scratch);
    /* per unit and part (0 forward, 1 backward): first and last use */
    int *first = arena_alloc(scratch, sizeof(int) * (size_t)(2 * nu + 1)),
        *last = arena_alloc(scratch, sizeof(int) * (size_t)(2 * nu + 1));
    for (int i = 0; i < 2 * nu; i++) first[i] = last[i] = -1;
    int *bufs = arena_alloc(scratch, sizeof(int) * (size_t)(nb + 8));
    unsigned char *wr = arena_alloc(scratch, (size_t)(nb + 8));
    for (int q = 0; q < pg.n; q++) {
        if (pg.launch[q] < 0) continue;
        int nbuf = plan_launch_bufs(r, pg.launch[q], bufs, wr, nb + 8);
        for (int j = 0; j < nbuf; j++) {
            if (bufs[j] < 0 || bufs[j] >= nb || unit_of[bufs[j]] < 0) continue;
            int e = 2 * unit_of[bufs[j]] + (q > pg.split);
            if (first[e] < 0) first[e] = q;
            last[e] = q;
        }
    }
    PlanGather *gs = arena_alloc(c->ar, sizeof *gs * (size_t)(2 * nu + 1));
    int ng = 0;
    for (int i = 0; i < 2 * nu; i++)
        if (first[i] >= 0) gs[ng++] = (PlanGather){u[i / 2].lo, u[i / 2].hi, first[i], last[i], 0};
    qsort(gs, (size_t)ng, sizeof *gs, gather_cmp);
    /* a prefetch that would meet the release of its unit's earlier part: one gather instead */
    for (int again = 1; again;) {
        again = 0;
        for (int nx = 1; nx < ng && !again; nx++) /* gather nx is posted at gather nx - 1's need */
            for (int e = 0; e < nx; e++)
                if (gs[e].lo == gs[nx].lo && gs[e].done >= gs[nx - 1].need) {
                    if (gs[nx].done > gs[e].done) gs[e].done = gs[nx].done;
                    memmove(&gs[nx], &gs[nx + 1], sizeof *gs * (size_t)(ng - nx - 1));
                    ng--, again = 1;
                    break;
                }
    }
    for (int j = 0; j < ng; j++) gs[j].post = j > 0 ? gs[j - 1].need : gs[j].need;
    /* the window: at each position the gathers posted and not yet released, their floats and the
     * pages they cover */
    *out = (PlanGatherSched){ng, gs, 0, 0, 0};
    int *stamp = gather_stamps(m, scratch);
    for (int q = 0; q < pg.n; q++) {
        int64_t held = 0, pages = 0;
        int units = 0;
        for (int j = 0; j < ng; j++)
            if (gs[j].post <= q && q <= gs[j].done) {
                held += gs[j].hi - gs[j].lo, units++;
                pages += gather_pages(&gs[j], m->gather_page, stamp, q);
            }
        if (held > out->window) out->window = held;
        if (units > out->units) out->units = units;
        if (pages > out->window_pages) out->window_pages = pages;
    }
    if (out->window > m->gather_window) m->gather_window = out->window;
    if (out->units > m->gather_units) m->gather_units = out->units;
    if (out->window_pages > m->gather_window_pages) m->gather_window_pages = out->window_pages;
}

void plan_gather(PlanCtx *c) {
    PlanMemory *m = &c->p->mem;
    const PlanPhaseMem *ph = &m->phase[PLAN_STEP];
    const FuseResult *r = ph->r;
    memset(m->gather, 0, sizeof m->gather);
    m->gather_window = 0, m->gather_units = 0, m->gather_window_pages = 0;
    m->gather_page = c->ts && c->ts->zero3_page > 0 ? c->ts->zero3_page : 4096;
    if (!r) return;
    Arena scratch = {0};
    /* the units: every parameter buffer's range, merged where ranges overlap */
    int nb = r->nbuffers, nu = 0;
    Unit *u = arena_alloc(&scratch, sizeof *u * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++)
        if (ph->slots[b].home == PH_PARAMS && ph->slots[b].bytes > 0)
            u[nu++] = (Unit){ph->slots[b].offset / 4, (ph->slots[b].offset + ph->slots[b].bytes + 3) / 4};
    qsort(u, (size_t)nu, sizeof *u, unit_cmp);
    int k = 0;
    for (int i = 0; i < nu; i++) {
        if (k > 0 && u[i].lo < u[k - 1].hi) {
            if (u[i].hi > u[k - 1].hi) u[k - 1].hi = u[i].hi;
        } else u[k++] = u[i];
    }
    nu = k;
    /* small units grouped: neighbours in the region (declaration order, the forward's order) joined
     * while the group spans at most a page (at least PLAN_GATHER_GROUP floats: the CPU's 4 KiB pages
     * keep the grouping it had), so that a layer's norms and biases are not each a collective of
     * their own (each pays the link's latency) nor, on a GPU's 2 MiB page, each a sliver of a page
     * mapped again by its neighbours; a larger unit is a group alone. Joining a unit that lies in
     * the group's last page (or a group in the unit's first) whatever the span, though it maps no
     * page more, was measured to enlarge the window (docs/parallel.md): not done. */
    int64_t span = m->gather_page / 4 > PLAN_GATHER_GROUP ? m->gather_page / 4 : PLAN_GATHER_GROUP;
    k = 0;
    for (int i = 0; i < nu; i++) {
        if (k > 0 && u[i].hi - u[k - 1].lo <= span) u[k - 1].hi = u[i].hi;
        else u[k++] = u[i];
    }
    nu = k;
    int *unit_of = arena_alloc(&scratch, sizeof(int) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) {
        unit_of[b] = -1;
        if (ph->slots[b].home != PH_PARAMS || ph->slots[b].bytes <= 0) continue;
        int64_t lo = ph->slots[b].offset / 4;
        for (int i = 0; i < nu; i++)
            if (lo >= u[i].lo && lo < u[i].hi) unit_of[b] = i;
    }
    for (int w = 0; w < PLAN_NGATHER; w++) build(c, w, u, nu, unit_of, &scratch);
    arena_free(&scratch);
}

/* The largest shard of the parameter region a rank holds: the runtime's shards (rt_comm_shards),
 * ceil(whole / data) rounded up to the gradient norm's blocks. */
static int64_t plan_shard(const Plan *p) {
    int64_t whole = p->mem.param_bytes / 4, shard = (whole + p->data - 1) / p->data;
    shard = (shard + PLAN_SHARD_ALIGN - 1) / PLAN_SHARD_ALIGN * PLAN_SHARD_ALIGN;
    return shard > whole ? whole : shard;
}

/* The most pages of the target's a rank's shard covers: a shard's start is a multiple of
 * PLAN_SHARD_ALIGN floats, so with larger pages it may begin inside one. */
static int64_t plan_shard_pages(const Plan *p) {
    int64_t pg = p->mem.gather_page, b = plan_shard(p) * 4, region = (p->mem.param_bytes + pg - 1) / pg;
    int64_t n = (b + pg - 1) / pg + (pg > PLAN_SHARD_ALIGN * 4 && b > 0 ? 1 : 0);
    return n < region ? n : region;
}

void plan_print_gather_summary(FILE *out, const Plan *p) {
    const PlanMemory *m = &p->mem;
    int64_t shard = plan_shard(p);
    fprintf(out,
            "plan: ZeRO-3: a rank holds its shard of at most %" PRId64 " bytes of the parameters and gathers at most %" PRId64
            " bytes more at once (%d gathers): %" PRId64 " of the region's %" PRId64 " bytes\n",
            shard * 4, m->gather_window * 4, m->gather_units, (shard + m->gather_window) * 4, m->param_bytes);
    int64_t pg = m->gather_page, region = (m->param_bytes + pg - 1) / pg, sp = plan_shard_pages(p);
    int64_t most = sp + m->gather_window_pages < region ? sp + m->gather_window_pages : region;
    fprintf(out,
            "plan: ZeRO-3: pages of %" PRId64 " bytes: the gathers map at most %" PRId64 " pages at once besides the %" PRId64
            " of a shard: %" PRId64 " of the region's %" PRId64 " pages (%" PRId64 " bytes)\n",
            pg, m->gather_window_pages, sp, most, region, most * pg);
}

void plan_print_gather(FILE *out, const Plan *p) {
    static const char *const fn[PLAN_NGATHER] = {"forward_backward (the step program)", "forward_loss (evaluation)",
                                                 "forward_stats (global_mean's pass)"};
    const PlanMemory *m = &p->mem;
    int64_t whole = m->param_bytes / 4, shard = plan_shard(p);
    fprintf(out,
            "\n## ZeRO-3: parameters gathered per use (parallel.zero = 3, %" PRId64 " ranks)\n"
            "each gather: a range of the parameter region, before its first use (in the step program: in the forward and "
            "in the backward) and released after its last, the next one prefetched\n"
            "window: at most %" PRId64 " floats (%d gathers) held besides a rank's shard of at most %" PRId64 " floats: %" PRId64
            " of the region's %" PRId64 " floats a rank\n"
            "pages: %" PRId64 " bytes (the target's: the CPU's 4 KiB, a GPU's allocation granularity, mbtc --zero3-page), "
            "gathers grouped to span a page or more; the gathers map at most %" PRId64 " pages at once besides a shard's at "
            "most %" PRId64 " (a page shared by two gathers counted once); on the GPU the calls that gather run uncaptured (no "
            "CUDA graph: the host maps and gathers between their launches)\n",
            p->data, m->gather_window, m->gather_units, shard, shard + m->gather_window, whole, m->gather_page,
            m->gather_window_pages, plan_shard_pages(p));
    for (int w = 0; w < PLAN_NGATHER; w++) {
        const PlanGatherSched *gs = &m->gather[w];
        fprintf(out, "### %s: %d gathers, window %" PRId64 " floats (%d gathers), %" PRId64 " pages\n", fn[w], gs->n, gs->window,
                gs->units, gs->window_pages);
        for (int j = 0; j < gs->n; j++) {
            const PlanGather *g = &gs->g[j];
            fprintf(out, "gather %d: floats [%" PRId64 ", %" PRId64 ") started before %d, needed before %d, released after %d\n",
                    j, g->lo, g->hi, g->post, g->need, g->done);
        }
    }
}

/* plan_verify's checks of a schedule, from its program's reads again: every parameter buffer a
 * launch reads is inside a gather held at that position (needed at or before it, released at or
 * after it); gathers are ordered by need, each started at the previous one's need; two gathers of
 * one range are not held at once (a prefetch never meets its range's release); ranges are inside
 * the region and the window is what the gathers hold. */
static void verify_one(PlanVerify *v, const Plan *p, int which) {
    const PlanMemory *m = &p->mem;
    const PlanPhaseMem *ph = &m->phase[PLAN_STEP];
    const PlanGatherSched *s = &m->gather[which];
    const FuseResult *r = ph->r;
    Arena ar = {0};
    Prog pg = program_of(p, which, &ar);
    int n = pg.n, nb = r->nbuffers;
    for (int k = 0; k < s->n; k++) {
        const PlanGather *g = &s->g[k];
        if (g->lo < 0 || g->hi <= g->lo || g->hi * 4 > m->param_bytes + 3)
            plan_v_fail(v, "gather %d: floats [%" PRId64 ", %" PRId64 ") are not a range of the parameter region", k, g->lo,
                        g->hi);
        if (!(g->post <= g->need && g->need <= g->done && g->done < n))
            plan_v_fail(v, "gather %d: started before %d, needed before %d, released after %d: out of order", k, g->post, g->need,
                        g->done);
        if (g->post != (k > 0 ? s->g[k - 1].need : g->need) || (k > 0 && g->need < s->g[k - 1].need))
            plan_v_fail(v, "gather %d is not started at the previous gather's need", k);
        for (int e = 0; e < k; e++) {
            const PlanGather *o = &s->g[e];
            int same = o->lo == g->lo && o->hi == g->hi, apart = o->hi <= g->lo || g->hi <= o->lo;
            if (!same && !apart) plan_v_fail(v, "gathers %d and %d overlap without being one range", e, k);
            if (same && o->done >= g->post) plan_v_fail(v, "gather %d starts before gather %d of its range is released", k, e);
        }
    }
    int *bufs = arena_alloc(&ar, sizeof(int) * (size_t)(nb + 8));
    unsigned char *wr = arena_alloc(&ar, (size_t)(nb + 8));
    int64_t window = 0, window_pages = 0;
    if (m->gather_page < 4096 || (m->gather_page & (m->gather_page - 1)) != 0)
        plan_v_fail(v, "ZeRO-3's page of %" PRId64 " bytes is not a power of two from 4096", m->gather_page);
    int *stamp = gather_stamps(m, &ar);
    for (int q = 0; q < n; q++) {
        int nbuf = pg.launch[q] >= 0 ? plan_launch_bufs(r, pg.launch[q], bufs, wr, nb + 8) : 0;
        for (int j = 0; j < nbuf; j++) {
            const PlanSlot *sl = bufs[j] >= 0 && bufs[j] < nb ? &ph->slots[bufs[j]] : NULL;
            if (!sl || sl->home != PH_PARAMS || sl->bytes <= 0) continue;
            int held = 0;
            for (int k = 0; k < s->n && !held; k++) {
                const PlanGather *g = &s->g[k];
                held = g->need <= q && q <= g->done && g->lo * 4 <= sl->offset && sl->offset + sl->bytes <= g->hi * 4;
            }
            if (!held) plan_v_fail(v, "position %d reads parameter buffer %d, which no gather holds there", q, bufs[j]);
        }
        int64_t h = 0, pages = 0;
        for (int k = 0; k < s->n; k++)
            if (s->g[k].post <= q && q <= s->g[k].done) {
                h += s->g[k].hi - s->g[k].lo;
                pages += gather_pages(&s->g[k], m->gather_page, stamp, q);
            }
        if (h > window) window = h;
        if (pages > window_pages) window_pages = pages;
    }
    arena_free(&ar);
    if (window != s->window)
        plan_v_fail(v, "the gathers hold %" PRId64 " floats at most, the plan says %" PRId64, window, s->window);
    if (window_pages != s->window_pages)
        plan_v_fail(v, "the gathers cover %" PRId64 " pages at most, the plan says %" PRId64, window_pages, s->window_pages);
    if (s->window_pages > m->gather_window_pages) plan_v_fail(v, "a schedule's pages are above the plan's");
    if (s->window > m->gather_window) plan_v_fail(v, "a schedule's window is above the plan's");
}

void plan_verify_gather(PlanVerify *v, const Plan *p) {
    if (!p->mem.phase[PLAN_STEP].r) return;
    for (int w = 0; w < PLAN_NGATHER; w++) verify_one(v, p, w);
}
