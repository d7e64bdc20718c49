/* plan_offload.c - offload.activations: which held buffers go to the store and when (plan.h,
 * PlanOffload; docs/memory.md, "Activation offload").
 *
 * Works on the step program of plan_recompute (the schedule's launches with any re-runs), after
 * the lives of its buffers are known. A candidate is a held buffer kept from the forward to the
 * backward (not recomputed) of at least PLAN_OFFLOAD_MIN bytes. Its write is issued right after
 * its last forward use and waited for k_w launches later; its read is issued k_r launches before
 * its first backward use and waited for just before that use. k_w and k_r come from its size and
 * assumed bandwidths: a copy of B bytes takes B / store_bw seconds, a launch takes the bytes it
 * touches / launch_bw seconds, and k is the fewest launches whose time covers the copy (never
 * reaching into the other side of the forward/backward turn). Between the write's wait and the
 * read its arena memory is free.
 *
 * What: walking the live bytes of the step program (every slot's size over its positions, the
 * lower bound of the arena), take the position where the most is live; of the candidates whose
 * free interval covers it, offload the largest, and repeat, until no candidate covers the highest
 * position: the largest buffers with the gaps that matter, and no more than what lowers the peak. */
#include <inttypes.h>
#include <stdlib.h>

#include "diag.h"
#include "plan_internal.h"

#define PLAN_OFFLOAD_MIN (64 * 1024)  /* smaller buffers are not worth a request */
#define PLAN_OFFLOAD_STORE_BW 1.0e9   /* bytes/s: an assumed NVMe read or write rate */
#define PLAN_OFFLOAD_LAUNCH_BW 10.0e9 /* bytes/s: an assumed rate at which a launch touches its buffers */
/* offload.activations = host (a GPU build): copies to pinned host memory over PCIe, launches on
 * the GPU. 20 GB/s is below what pinned copies reach on PCIe 4.0 x16 (~25 GB/s) and 5.0 (~50); a
 * launch touching its buffers at 1 TB/s is below an A100's or H100's memory bandwidth (2-3.4 TB/s)
 * and far below a GEMM's arithmetic time: both err towards more launches to cover a copy, i.e.
 * waits that come later and reads issued earlier. Neither was measured (docs/memory.md). */
#define PLAN_OFFLOAD_HOST_BW 20.0e9
#define PLAN_OFFLOAD_GPU_LAUNCH_BW 1000.0e9

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* The copies of the chosen candidates c[set[0..m)], one after another at bw bytes/s over the
 * positions' start times t0: writes in the order they are issued, each from the end of its
 * buffer's last forward use or the end of the write before, whichever is later, waited for before
 * the first position that starts after it ends (ww); reads backwards from the last, each ending by
 * its use and by the start of the read after it, issued at the last position that starts before
 * that (rr). 1 when every write ends by the start of the backward (turn), every read starts after
 * it, and each buffer is away somewhere (ww < rr); ww and rr are in set's order. */
static int offload_schedule(const PlanOffload *c, const int *set, int m, const double *t0, int turn, double bw, int *ww,
                            int *rr) {
    int *ord = malloc(sizeof(int) * (size_t)(m + 1));
    if (!ord) INTERNAL("plan: out of memory");
    int ok = 1;
    /* writes: by issue (write_after, then the buffer, as host.c emits them) */
    for (int i = 0; i < m; i++) {
        int j = i;
        for (; j > 0; j--) {
            const PlanOffload *a = &c[set[ord[j - 1]]], *b = &c[set[i]];
            if (a->write_after < b->write_after || (a->write_after == b->write_after && a->buffer < b->buffer)) break;
            ord[j] = ord[j - 1];
        }
        ord[j] = i;
    }
    double end = 0;
    for (int k = 0; k < m; k++) {
        const PlanOffload *o = &c[set[ord[k]]];
        double start = t0[o->write_after + 1] > end ? t0[o->write_after + 1] : end;
        end = start + (double)o->bytes / bw;
        int w = o->write_after + 1;
        while (w < turn && t0[w] < end) w++;
        if (t0[w] < end) ok = 0; /* not done when the backward starts */
        ww[ord[k]] = w;
    }
    /* reads: by use, scheduled from the last */
    for (int i = 0; i < m; i++) {
        int j = i;
        for (; j > 0; j--) {
            const PlanOffload *a = &c[set[ord[j - 1]]], *b = &c[set[i]];
            if (a->use < b->use || (a->use == b->use && a->buffer < b->buffer)) break;
            ord[j] = ord[j - 1];
        }
        ord[j] = i;
    }
    double next = -1; /* when the read after this one starts (-1: none) */
    for (int k = m - 1; k >= 0; k--) {
        const PlanOffload *o = &c[set[ord[k]]];
        double due = next >= 0 && next < t0[o->use] ? next : t0[o->use];
        double start = due - (double)o->bytes / bw;
        int q = o->use;
        while (q > turn && t0[q] > start) q--;
        if (t0[q] > start) ok = 0; /* would have to start before the backward */
        rr[ord[k]] = q;
        next = start;
    }
    for (int i = 0; i < m && ok; i++) ok = ww[i] < rr[i];
    free(ord);
    return ok;
}

void plan_offload(PlanCtx *c, const FuseResult *r, PlanRecompute *rc, PlanSlot *slots) {
    Arena *ar = c->ar;
    int nb = r->nbuffers, n = rc->norder;
    int host = rc->offload == STORE_HOST;
    rc->store_bw = c->ts->offload_gbps > 0 ? c->ts->offload_gbps * 1e9 : host ? PLAN_OFFLOAD_HOST_BW : PLAN_OFFLOAD_STORE_BW;
    /* nvme on a GPU build: each chunk goes device -> pinned staging (PCIe, ~20 GB/s), then to the
     * store (~1 GB/s), one after the other on one stream (gpu_act.c), so the assumed copy rate is the
     * two legs' in series (--offload-gbps gives the whole copy's); the launches are the GPU's */
    rc->gpu = c->ts->offload_gpu;
    if (rc->gpu && !host && c->ts->offload_gbps <= 0)
        rc->store_bw = 1.0 / (1.0 / PLAN_OFFLOAD_STORE_BW + 1.0 / PLAN_OFFLOAD_HOST_BW);
    rc->launch_bw = host || rc->gpu ? PLAN_OFFLOAD_GPU_LAUNCH_BW : PLAN_OFFLOAD_LAUNCH_BW;
    rc->off = arena_alloc(ar, sizeof(int) * (size_t)(nb + 1));
    for (int b = 0; b < nb; b++) rc->off[b] = -1;
    /* the turn: the first position of a backward launch or a re-run */
    int turn = 0;
    while (turn < n && rc->order[turn] >= 0 && rc->order[turn] < rc->boundary) turn++;
    /* each buffer's last forward and first backward position; each position's time */
    int *lastf = malloc(sizeof(int) * (size_t)(nb + 1)), *usef = malloc(sizeof(int) * (size_t)(nb + 1));
    double *t = malloc(sizeof(double) * (size_t)(n + 1));
    int64_t *live = calloc((size_t)n + 1, sizeof(int64_t));
    if (!lastf || !usef || !t || !live) INTERNAL("plan: out of memory");
    for (int b = 0; b < nb; b++) lastf[b] = -1, usef[b] = n;
    for (int q = 0; q < n; q++) {
        int o = rc->order[q], li = o >= 0 ? o : rc->reruns[-1 - o].launch;
        int cap = r->launches[li].kind == FL_KERNEL ? r->kernels[r->launches[li].kernel]->nbufs : 4;
        int *bv = malloc(sizeof(int) * (size_t)(cap + 1));
        unsigned char *wv = malloc((size_t)cap + 1);
        if (!bv || !wv) INTERNAL("plan: out of memory");
        int m = plan_launch_bufs(r, li, bv, wv, cap);
        int64_t touched = 0;
        for (int i = 0; i < m; i++) {
            int b = bv[i];
            touched += r->buffers[b].bytes;
            if (q < turn) lastf[b] = q;
            else if (usef[b] == n) usef[b] = q;
        }
        t[q] = (double)touched / rc->launch_bw;
        free(bv), free(wv);
    }
    /* the live bytes at each position: first copies and re-runs' second copies */
    for (int b = 0; b < nb; b++) {
        const PlanSlot *s[2] = {&slots[b], rc->rerun[b] >= 0 ? &rc->again[b] : NULL};
        for (int k = 0; k < 2; k++)
            if (s[k] && s[k]->first >= 0 && r->buffers[b].kind != FB_PARAM && r->buffers[b].kind != FB_INPUT)
                for (int q = s[k]->first; q <= s[k]->last && q < n; q++) live[q] += align_up(r->buffers[b].bytes, PLAN_ALIGN);
    }
    /* the candidates: a write can be waited for no earlier than the copy alone takes, a read
     * must be issued no later than that before its use (the bounds the schedule below tightens) */
    double *t0 = malloc(sizeof(double) * (size_t)(n + 2)); /* t0[q]: when position q starts */
    if (!t0) INTERNAL("plan: out of memory");
    t0[0] = 0;
    for (int q = 0; q < n; q++) t0[q + 1] = t0[q] + t[q];
    PlanOffload *cand = malloc(sizeof(PlanOffload) * (size_t)(nb + 1));
    if (!cand) INTERNAL("plan: out of memory");
    int ncand = 0;
    for (int b = 0; b < nb; b++) {
        if (rc->fate[b] != PF_KEPT || r->buffers[b].bytes < PLAN_OFFLOAD_MIN) continue;
        if (lastf[b] < 0 || usef[b] >= n) continue;
        double copy = (double)r->buffers[b].bytes / rc->store_bw, acc = 0;
        int ww = lastf[b] + 1;
        while (ww < turn && acc < copy) acc += t[ww++];
        int rr = usef[b];
        acc = 0;
        while (rr > turn && acc < copy) acc += t[--rr];
        if (rr <= ww) continue; /* no launch runs without it */
        cand[ncand++] = (PlanOffload){b, r->buffers[b].bytes, 0, lastf[b], ww, rr, usef[b]};
    }
    /* the choice: the largest candidate covering the highest live position, until none does. The
     * copies go one after another (one copy stream, one store), so each time a candidate is tried
     * the chosen ones' copies are scheduled together (offload_schedule): a write starts when its
     * buffer's last forward use and the write before it are done, a read ends before its use and
     * before the read after it starts; a candidate is taken when every write then ends before the
     * backward starts, every read starts after it, and its own buffer is still away where the most
     * is live. */
    unsigned char *taken = calloc((size_t)ncand + 1, 1);
    int *set = malloc(sizeof(int) * (size_t)(ncand + 1)), *sww = malloc(sizeof(int) * (size_t)(ncand + 1)),
        *srr = malloc(sizeof(int) * (size_t)(ncand + 1)), *best_ww = malloc(sizeof(int) * (size_t)(ncand + 1)),
        *best_rr = malloc(sizeof(int) * (size_t)(ncand + 1));
    int64_t *live0 = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!taken || !set || !sww || !srr || !best_ww || !best_rr || !live0) INTERNAL("plan: out of memory");
    for (int q = 0; q < n; q++) live0[q] = live[q];
    int ntaken = 0;
    int qfirst = -1; /* the highest position at the start */
    for (;;) {
        int qmax = 0;
        for (int q = 1; q < n; q++)
            if (live[q] > live[qmax]) qmax = q;
        if (qfirst < 0) qfirst = qmax;
        int got = -1;
        for (;;) { /* the largest untried candidate whose bounds cover qmax; rejected ones stay out */
            int best = -1;
            for (int i = 0; i < ncand; i++)
                if (!taken[i] && cand[i].write_wait <= qmax && qmax < cand[i].read_at &&
                    (best < 0 || cand[i].bytes > cand[best].bytes))
                    best = i;
            if (best < 0) break;
            set[ntaken] = best;
            if (offload_schedule(cand, set, ntaken + 1, t0, turn, rc->store_bw, sww, srr) && sww[ntaken] <= qmax &&
                qmax < srr[ntaken]) {
                got = best;
                break;
            }
            taken[best] = 2; /* does not fit beside the chosen ones: not tried again */
        }
        if (got < 0) break;
        taken[got] = 1, ntaken++;
        for (int i = 0; i < ntaken; i++) best_ww[i] = sww[i], best_rr[i] = srr[i];
        for (int q = 0; q < n; q++) live[q] = live0[q];
        for (int i = 0; i < ntaken; i++)
            for (int q = best_ww[i]; q < best_rr[i]; q++) live[q] -= align_up(cand[set[i]].bytes, PLAN_ALIGN);
    }
    for (int i = 0; i < ncand; i++) taken[i] = taken[i] == 1;
    for (int i = 0; i < ntaken; i++) cand[set[i]].write_wait = best_ww[i], cand[set[i]].read_at = best_rr[i];
    free(set), free(sww), free(srr), free(best_ww), free(best_rr), free(live0), free(t0);
    /* in buffer order: the store slots, the fates and the two copies */
    rc->noffloads = ntaken;
    rc->offloads = arena_alloc(ar, sizeof(PlanOffload) * (size_t)(ntaken + 1));
    int j = 0;
    for (int i = 0; i < ncand; i++) {
        if (!taken[i]) continue;
        PlanOffload *o = &rc->offloads[j];
        *o = cand[i];
        int b = o->buffer;
        /* the store slot: the buffer's bytes rounded up to whole pages (both its copies start a
         * page of the arena and have room for the rounding: plan_memory pads them) */
        o->store_off = rc->store_bytes;
        rc->store_bytes += align_up(o->bytes, PLAN_OFFLOAD_PAGE);
        rc->held_offloaded += o->bytes;
        rc->fate[b] = PF_OFFLOAD;
        rc->off[b] = j++;
        rc->again[b] = (PlanSlot){PH_NONE, 0, r->buffers[b].bytes, o->read_at, slots[b].last};
        slots[b].last = o->write_wait - 1;
    }
    if (ntaken == 0)
        plan_note(c, arena_printf(ar,
                                  "offload.activations: the step's live bytes peak at position %d of %d (the backward starts "
                                  "at %d), where no held buffer of at least 64 KiB could be away: nothing is offloaded "
                                  "(docs/memory.md)",
                                  qfirst, n, turn));
    free(taken), free(cand), free(live), free(t), free(usef), free(lastf);
}
