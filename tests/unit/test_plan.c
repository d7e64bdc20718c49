/* test_plan.c - unit tests of the step program and the memory plan (compiler/plan.c), of the
 * optimizer's update graph (graph_build.c via sema_build_train) and of its segmented norm
 * (compiler/ref_seg.c).
 *
 * Build: make unit (links build/libmbtc.a). Run from the repository root (tests/run.sh does): the
 * programs `import optim` from ./stdlib. Prints `PASS name` or `FAIL name: why` per case, then
 * `N passed, M failed`; exits 1 on a failure.
 *
 * What is held against what:
 *   - plan_assign_offsets on thousands of random interval sets (greedy by size), and on three sets
 *     past PLAN_GREEDY_MAX (time-ordered best fit): no two buffers live at a common step share a
 *     byte (checked pair by pair), every offset aligned, the peak is the highest end, at least the
 *     most bytes live at any one step, and at most the naive total; and the same input gives the
 *     same offsets.
 *   - the regions of a compiled program: parameters contiguous at 64-byte aligned offsets in
 *     declaration order (each the next aligned offset), gradients and each state part alike.
 *   - the step program's numbers for batch { global = 32, micro = 8 } (accumulation 4) and with
 *     parallel { data = 2 } (accumulation 2, an all-reduce), clipping, and a batch-size ramp.
 *   - the update graphs of the stdlib's adamw, sgd, lion and lamb, run for three steps by ref.c,
 *     against optimizer steps written out here in C as PyTorch does them (AdamW: decoupled weight
 *     decay p *= 1 - lr wd, bias-corrected moments, step lr / (1 - b1^t), denominator
 *     sqrt(v) / sqrt(1 - b2^t) + eps), to 1e-12 relative; padding between parameters stays 0.
 *   - the user errors of the plan stage: a reduction inside update, an `if` on t, a schedule for
 *     an optimizer without lr. */
#include <math.h>
#include <stdint.h>

#include "unit.h"
#include "autodiff.h"
#include "module.h"
#include "parse.h"
#include "fuse.h"
#include "plan.h"
#include "ref.h"

/* ---- randomness ----------------------------------------------------------------------------- */

static uint64_t tp_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int tp_int(uint64_t *s, int lo, int hi) { return lo + (int)(tp_next(s) % (uint64_t)(hi - lo + 1)); }

static double tp_uniform(uint64_t *s, double lo, double hi) {
    return lo + (hi - lo) * ((double)(tp_next(s) >> 11) / 9007199254740992.0);
}

/* ---- plan_assign_offsets --------------------------------------------------------------------- */

/* Checks one assignment; returns 0 when it holds (reporting the first problem otherwise). */
static int check_assignment(const PlanBuffer *b, int n, int64_t align, int64_t peak, int trial) {
    int64_t naive = plan_naive_bytes(b, n, align), top = 0;
    for (int i = 0; i < n; i++) {
        if (b[i].offset < 0 || b[i].offset % align != 0) {
            CHECK(0, "trial %d: buffer %d at offset %lld is not aligned to %lld", trial, i, (long long)b[i].offset,
                  (long long)align);
            return 1;
        }
        int64_t end = b[i].offset + plan_align_up(b[i].size, align);
        if (b[i].size > 0 && end > top) top = end;
        for (int j = 0; j < i; j++) {
            if (!b[i].size || !b[j].size || b[i].last < b[j].first || b[j].last < b[i].first) continue;
            if (b[i].offset < b[j].offset + b[j].size && b[j].offset < b[i].offset + b[i].size) {
                CHECK(0, "trial %d: buffers %d [%lld, +%lld) live %d..%d and %d [%lld, +%lld) live %d..%d overlap", trial, j,
                      (long long)b[j].offset, (long long)b[j].size, b[j].first, b[j].last, i, (long long)b[i].offset,
                      (long long)b[i].size, b[i].first, b[i].last);
                return 1;
            }
        }
    }
    /* the most bytes live at one step: a lower bound no assignment can beat */
    int64_t low = 0;
    for (int i = 0; i < n; i++) {
        int64_t live = 0;
        for (int j = 0; j < n; j++)
            if (b[j].first <= b[i].first && b[i].first <= b[j].last) live += plan_align_up(b[j].size, align);
        if (live > low) low = live;
    }
    if (peak != top || peak > naive || peak < low) {
        CHECK(0, "trial %d: peak %lld, highest end %lld, naive %lld, live lower bound %lld", trial, (long long)peak,
              (long long)top, (long long)naive, (long long)low);
        return 1;
    }
    return 0;
}

static void assign_random(void) {
    uint64_t rng = 0x243F6A8885A308D3ull;
    Arena ar = {0};
    int64_t saved = 0, naive_all = 0;
    for (int trial = 0; trial < 4000; trial++) {
        int n = tp_int(&rng, 0, 48);
        int horizon = tp_int(&rng, 1, 80);
        int64_t align = (int64_t)1 << tp_int(&rng, 0, 7);
        PlanBuffer *b = arena_alloc(&ar, sizeof(PlanBuffer) * (size_t)(n + 1));
        for (int i = 0; i < n; i++) {
            int kind = tp_int(&rng, 0, 9);
            b[i].size = kind == 0 ? 0 : kind < 7 ? tp_int(&rng, 1, 600) : tp_int(&rng, 1000, 200000);
            b[i].first = tp_int(&rng, 0, horizon);
            b[i].last = b[i].first + (tp_int(&rng, 0, 3) == 0 ? 0 : tp_int(&rng, 0, horizon / 2 + 1));
            b[i].offset = -7; /* overwritten */
        }
        PlanBuffer *again = arena_dup(&ar, b, sizeof(PlanBuffer) * (size_t)(n + 1));
        int64_t peak = plan_assign_offsets(b, n, align, &ar);
        if (check_assignment(b, n, align, peak, trial)) break;
        int64_t peak2 = plan_assign_offsets(again, n, align, &ar);
        int same = peak2 == peak;
        for (int i = 0; i < n; i++) same &= again[i].offset == b[i].offset;
        CHECK(same, "trial %d: the same buffers got other offsets the second time", trial);
        if (!same) break;
        saved += plan_naive_bytes(b, n, align) - peak;
        naive_all += plan_naive_bytes(b, n, align);
        if (trial % 500 == 0) arena_free(&ar);
    }
    printf("# assign_random: 4000 interval sets, reuse saved %.1f%% of the naive bytes\n",
           naive_all ? 100.0 * (double)saved / (double)naive_all : 0.0);
    arena_free(&ar);
}

/* More buffers than PLAN_GREEDY_MAX: the time-ordered best fit, held to the same rules. */
static void assign_large(void) {
    uint64_t rng = 0x13198A2E03707344ull;
    Arena ar = {0};
    for (int trial = 0; trial < 3; trial++) {
        int n = PLAN_GREEDY_MAX + 2000 + trial * 1000, horizon = 3 * n;
        PlanBuffer *b = arena_alloc(&ar, sizeof(PlanBuffer) * (size_t)n);
        for (int i = 0; i < n; i++) {
            b[i].size = tp_int(&rng, 0, 9) == 0 ? 0 : tp_int(&rng, 1, 100000);
            b[i].first = tp_int(&rng, 0, horizon);
            b[i].last = b[i].first + (tp_int(&rng, 0, 9) == 0 ? tp_int(&rng, 0, horizon) : tp_int(&rng, 0, 50));
        }
        PlanBuffer *again = arena_dup(&ar, b, sizeof(PlanBuffer) * (size_t)n);
        int64_t peak = plan_assign_offsets(b, n, 64, &ar);
        if (check_assignment(b, n, 64, peak, trial)) break;
        int same = plan_assign_offsets(again, n, 64, &ar) == peak;
        for (int i = 0; i < n; i++) same &= again[i].offset == b[i].offset;
        CHECK(same, "trial %d: the same buffers got other offsets the second time", trial);
        printf("# assign_large: %d buffers, peak %lld, naive %lld\n", n, (long long)peak, (long long)plan_naive_bytes(b, n, 64));
    }
    arena_free(&ar);
}

/* Cases whose answer is known exactly. */
static void assign_exact(void) {
    Arena ar = {0};
    /* nothing */
    CHECK(plan_assign_offsets(NULL, 0, 64, &ar) == 0, "no buffers: peak 0");
    /* all live together: stacked, largest first, so the peak is the sum */
    PlanBuffer a[3] = {{100, 0, 5, 0}, {300, 0, 5, 0}, {64, 2, 3, 0}};
    int64_t peak = plan_assign_offsets(a, 3, 64, &ar);
    CHECK(peak == 128 + 320 + 64, "stacked: peak %lld", (long long)peak);
    CHECK(a[1].offset == 0 && a[0].offset == 320 && a[2].offset == 448, "stacked offsets %lld %lld %lld", (long long)a[0].offset,
          (long long)a[1].offset, (long long)a[2].offset);
    /* never live together: all at 0, the peak the largest */
    PlanBuffer b[3] = {{100, 0, 1, 0}, {300, 2, 3, 0}, {64, 4, 9, 0}};
    peak = plan_assign_offsets(b, 3, 64, &ar);
    CHECK(peak == 320 && b[0].offset == 0 && b[1].offset == 0 && b[2].offset == 0, "disjoint: peak %lld", (long long)peak);
    /* best fit: the last buffer sees two gaps among the buffers live with it, [1024, 1536) between
     * big and mid (left by p2) and [1792, 1920) between mid and last (left by p1): the smaller wins */
    PlanBuffer c[6] = {
        {1024, 0, 9, 0}, /* big: [0, 1024) */
        {500, 0, 0, 0},  /* p2: [1024, 1536), dies at 0 */
        {256, 0, 9, 0},  /* mid: [1536, 1792) */
        {100, 0, 0, 0},  /* p1: [1792, 1920), dies at 0 */
        {64, 0, 9, 0},   /* last: [1920, 1984) */
        {64, 1, 9, 0},   /* from step 1 */
    };
    peak = plan_assign_offsets(c, 6, 64, &ar);
    CHECK(c[1].offset == 1024 && c[2].offset == 1536 && c[3].offset == 1792 && c[4].offset == 1920,
          "best fit: offsets %lld %lld %lld %lld", (long long)c[1].offset, (long long)c[2].offset, (long long)c[3].offset,
          (long long)c[4].offset);
    CHECK(c[5].offset == 1792, "best fit: offset %lld, expected the smaller gap at 1792", (long long)c[5].offset);
    CHECK(peak == 1984, "best fit: peak %lld", (long long)peak);
    /* zero-size buffers take no memory */
    PlanBuffer z[2] = {{0, 0, 3, 5}, {10, 0, 3, 0}};
    peak = plan_assign_offsets(z, 2, 16, &ar);
    CHECK(peak == 16 && z[0].offset == 0 && z[1].offset == 0, "zero size: peak %lld", (long long)peak);
    arena_free(&ar);
}

/* ---- compiling programs ---------------------------------------------------------------------- */

typedef struct Built {
    Arena ar;
    TrainBuild *tb;
    Plan *plan;
} Built;

/* Parses src as the main module and builds train block `train` (NULL: the first) and its plan. */
static Built *build(const char *src, const char *train) {
    Built *b = calloc(1, sizeof(Built));
    if (!b) exit(1);
    size_t len = strlen(src);
    char *text = arena_strndup(&b->ar, src, len);
    uint32_t file = diag_add_source("plan_test.mbt", text, (uint32_t)len);
    Module *m = arena_alloc(&b->ar, sizeof(Module));
    m->name = "plan_test";
    m->path = "plan_test.mbt";
    m->file = file;
    int before = diag_error_count();
    m->ast = parse_source(&b->ar, file);
    if (diag_error_count() != before) return b;
    Loader ld;
    loader_init(&ld, &b->ar, NULL, 0, "stdlib");
    ptrvec_push(&b->ar, &ld.modules, m);
    b->tb = sema_build_train(&ld, m, train, PLAN_ALIGN / 4, &b->ar);
    if (!b->tb) return b;
    int first_bwd = autodiff(b->tb->step);
    CHECK(graph_verify(b->tb->step, stdout) == 0, "the step graph verifies");
    CHECK(graph_verify(b->tb->update, stdout) == 0, "the update graph verifies");
    PlanSchedules sched;
    FuseResult *fused[2] = {fuse_graph(b->tb->step, NULL, 0, &b->ar), fuse_graph(b->tb->update, NULL, 0, &b->ar)};
    if (plan_schedules(b->tb, fused, &sched, &b->ar)) return b;
    b->plan = plan_build(b->tb, first_bwd, &sched, &b->ar);
    if (b->plan) CHECK(plan_verify(b->plan, stdout) == 0, "the plan verifies");
    return b;
}

static void built_free(Built *b) {
    arena_free(&b->ar);
    free(b);
}

/* A small model: parameters of 7, 15, 1, 33 and 4 values (so the layout pads between them). */
#define TP_MODEL                                                                                                                 \
    "model P(n = 5) {\n"                                                                                                         \
    "  a = param f32[7] ~ normal(0, 1)\n"                                                                                        \
    "  b = param f32[n, 3] ~ normal(0, 1)\n"                                                                                     \
    "  c = param f32[] ~ ones\n"                                                                                                 \
    "  d = param f32[33] ~ normal(0, 1)\n"                                                                                       \
    "  e = param f32[4]\n"                                                                                                       \
    "  fn forward(idx: i32[B, T]) -> f32[B, T, 3] {\n"                                                                           \
    "    return one_hot(idx, n) @ b + sum(a) * c + mean(d) + sum(e)\n"                                                           \
    "  }\n"                                                                                                                      \
    "}\n"

static const char *program(Arena *ar, const char *optimizer, const char *extra) {
    return arena_printf(ar,
                        "import optim\nimport lr\n" TP_MODEL "train t {\n  model = P()\n  data = tokens(\"x.bin\", seq = 4)\n"
                        "  loss = cross_entropy(model(data.x), data.y)\n  optimizer = %s\n  steps = 100\n%s}\n",
                        optimizer, extra);
}

/* ---- regions and the step program ------------------------------------------------------------ */

static void regions_contiguous(void) {
    Arena ar = {0};
    Built *b = build(program(&ar, "optim.adamw(lr = 1e-3)", "  batch { global = 32, micro = 8 }\n"), NULL);
    if (!b->plan) {
        CHECK(0, "the program did not build");
        built_free(b);
        arena_free(&ar);
        return;
    }
    const PlanMemory *m = &b->plan->mem;
    static const int64_t numel[5] = {7, 15, 1, 33, 4};
    static const char *const names[5] = {"a", "b", "c", "d", "e"};
    CHECK(m->nparams == 5, "%d parameters", m->nparams);
    int64_t end = 0;
    for (int i = 0; i < m->nparams && i < 5; i++) {
        const PlanParam *q = &m->params[i];
        CHECK(strcmp(q->name, names[i]) == 0 && q->numel == numel[i], "parameter %d is %s with %lld values", i, q->name,
              (long long)q->numel);
        CHECK(q->offset == plan_align_up(end, PLAN_ALIGN), "parameter %s at %lld, expected the next aligned offset %lld", q->name,
              (long long)q->offset, (long long)plan_align_up(end, PLAN_ALIGN));
        end = q->offset + q->numel * 4;
        /* the gradient is added from its arena buffer into the same offset of the gradient region */
        const PlanPhaseMem *st = &m->phase[PLAN_STEP];
        int found = 0;
        for (int k = 0; k < st->nwrites; k++) {
            const PlanWrite *w = &st->writes[k];
            if (w->to != PH_GRADS || w->offset != q->offset) continue;
            found++;
            CHECK(w->accumulate && w->bytes == q->numel * 4 && st->slots[w->buffer].home == PH_ARENA,
                  "gradient of %s: %lld bytes added from an arena buffer", q->name, (long long)w->bytes);
        }
        CHECK(found == 1, "the gradient of %s is added once (%d)", q->name, found);
        int pb = st->r->node_buffer[q->node];
        CHECK(pb >= 0 && st->slots[pb].home == PH_PARAMS && st->slots[pb].offset == q->offset,
              "the parameter buffer of %s lives in the region", q->name);
    }
    /* offsets 0, 64, 128, 192, 384: 7, 15, 1 and 33 values each fit below the next multiple of 16 values */
    CHECK(m->params[0].offset == 0 && m->params[1].offset == 64 && m->params[2].offset == 128 && m->params[3].offset == 192 &&
              m->params[4].offset == 384,
          "offsets %lld %lld %lld %lld %lld", (long long)m->params[0].offset, (long long)m->params[1].offset,
          (long long)m->params[2].offset, (long long)m->params[3].offset, (long long)m->params[4].offset);
    CHECK(m->param_bytes == plan_align_up(end, PLAN_ALIGN) && m->param_bytes == 448, "parameter region %lld bytes",
          (long long)m->param_bytes);
    CHECK(m->nstate == 2 && m->state_bytes == 2 * m->param_bytes, "state: %d parts, %lld bytes", m->nstate,
          (long long)m->state_bytes);
    const GraphUpdate *u = b->tb->update->update;
    CHECK(u->n * 4 == m->param_bytes, "the update graph's length matches the region");
    for (int i = 0; i < u->nsegs; i++) CHECK(u->seg_off[i] * 4 == m->params[i].offset, "segment %d at the parameter's offset", i);
    /* the update's inputs live in the regions, lr and t in the arena's reserved bytes */
    const PlanPhaseMem *up = &m->phase[PLAN_UPDATE];
    const int *nb = up->r->node_buffer;
    CHECK(up->slots[nb[u->p_in]].home == PH_PARAMS && up->slots[nb[u->g_in]].home == PH_GRADS, "p and g in their regions");
    CHECK(up->slots[nb[u->state_in[1]]].home == PH_STATE && up->slots[nb[u->state_in[1]]].offset == m->param_bytes,
          "state.v is the second part of the state region");
    CHECK(up->slots[nb[u->lr_in]].home == PH_ARENA && up->slots[nb[u->lr_in]].offset == m->lr_offset &&
              m->t_offset == m->lr_offset + 4 && up->reserve == PLAN_ALIGN,
          "lr and t in the update's reserved arena bytes");
    /* adamw's results are written over their inputs (fuse.c's fz_update_in_place): p, m and v take
     * the inputs' buffers, in their regions, and nothing is copied after the launches */
    CHECK(up->nwrites == 0 && up->r->n_in_place == 3 && !up->r->not_in_place, "%d update moves, %d in place (%s)", up->nwrites,
          up->r->n_in_place, up->r->not_in_place ? up->r->not_in_place : "-");
    CHECK(nb[u->p_out] == nb[u->p_in] && nb[u->state_out[0]] == nb[u->state_in[0]] && nb[u->state_out[1]] == nb[u->state_in[1]],
          "p, m and v in place");
    CHECK(up->peak == up->reserve, "the update's arena holds lr and t alone (%lld bytes)", (long long)up->peak);
    /* inputs: data.x and data.y, i32[8, 4] each, in the runtime's two batch buffers */
    CHECK(m->ninputs == 2 && m->inputs[0].home == PH_X && m->inputs[1].home == PH_Y && m->inputs[0].bytes == 8 * 4 * 4 &&
              m->inputs[1].bytes == 8 * 4 * 4 && m->input_bytes == 2 * 8 * 4 * 4,
          "%d inputs, %lld bytes", m->ninputs, (long long)m->input_bytes);
    /* three phases (the model's output is logits; it has no attention, so no chunk phase, and the
     * plan says why), the arena the largest of their peaks */
    int64_t largest = 0;
    const char *why = b->plan->sched.why_no_chunk;
    CHECK(!m->phase[PLAN_CHUNK].r && why && strstr(why, "no attention"), "no chunk phase: %s", why ? why : "(none)");
    for (int i = 0; i < PLAN_CHUNK; i++) {
        const PlanPhaseMem *ph = &m->phase[i];
        CHECK(ph->r && ph->peak <= ph->naive && ph->kernels == ph->r->nkernels && ph->gemms == ph->r->ngemms,
              "phase %s: peak %lld, naive %lld", ph->name, (long long)ph->peak, (long long)ph->naive);
        if (ph->peak > largest) largest = ph->peak;
    }
    CHECK(m->arena_bytes == largest && up->peak >= up->reserve, "arena %lld, the largest peak %lld", (long long)m->arena_bytes,
          (long long)largest);
    built_free(b);
    arena_free(&ar);
}

static int has_op(const PlanProgram *pr, PlanOpKind k) {
    for (int i = 0; i < pr->nops; i++)
        if (pr->ops[i].kind == k) return 1;
    return 0;
}

static void program_accumulation(void) {
    Arena ar = {0};
    Built *b = build(program(&ar, "optim.sgd(lr = 0.1)", "  batch { global = 32, micro = 8 }\n"), NULL);
    const Plan *p = b->plan;
    CHECK(p && p->nprograms == 1, "one step program");
    if (p && p->nprograms == 1) {
        const PlanProgram *pr = &p->programs[0];
        CHECK(pr->global == 32 && pr->micro == 8 && pr->accumulation == 4 && pr->data == 1,
              "global %lld = micro %lld x accumulation %lld x data %lld", (long long)pr->global, (long long)pr->micro,
              (long long)pr->accumulation, (long long)pr->data);
        CHECK(pr->loss_scale == 0.25, "loss scale %g, expected 1/4", pr->loss_scale);
        CHECK(pr->first_step == 0 && pr->last_step == 99, "steps %lld..%lld", (long long)pr->first_step,
              (long long)pr->last_step);
        static const PlanOpKind want[5] = {PO_LOAD, PO_RUN, PO_LOSS, PO_SCHEDULE, PO_UPDATE};
        CHECK(pr->nops == 5, "%d ops", pr->nops);
        for (int i = 0; i < pr->nops && i < 5; i++)
            CHECK(pr->ops[i].kind == want[i] && pr->ops[i].per_micro == (i < 3), "op %d", i);
        CHECK(p->seed >= 0 && p->seed == p->first_bwd, "the backward's seed is autodiff's first node");
        const GNode *seed = graph_node(p->step, p->seed);
        CHECK(seed->op == G_CONST && seed->fattr[0] == 1.0 && seed->rank == 0, "the seed is d loss = 1 in the graph");
        CHECK(!p->schedule && p->has_lr && p->lr_base == 0.1, "lr 0.1 without a schedule");
    }
    built_free(b);
    b = build(program(&ar, "optim.sgd(lr = 0.1)",
                      "  batch { global = 32, micro = 8 }\n  parallel { data = 2 }\n"
                      "  clip = 1.0\n  lr = lr.cosine(warmup = 10, total = 100)\n"),
              NULL);
    p = b->plan;
    CHECK(p && p->nprograms == 1, "one step program with data = 2");
    if (p && p->nprograms == 1) {
        const PlanProgram *pr = &p->programs[0];
        CHECK(pr->global == 32 && pr->micro == 8 && pr->accumulation == 2 && pr->data == 2,
              "data = 2: global %lld = micro %lld x accumulation %lld x data %lld", (long long)pr->global, (long long)pr->micro,
              (long long)pr->accumulation, (long long)pr->data);
        CHECK(pr->loss_scale == 0.25, "data = 2: loss scale %g, expected 1/(2 x 2)", pr->loss_scale);
        CHECK(has_op(pr, PO_ALLREDUCE) && has_op(pr, PO_CLIP), "an all-reduce and a clip");
        int ar_at = -1, clip_at = -1;
        for (int i = 0; i < pr->nops; i++) {
            if (pr->ops[i].kind == PO_ALLREDUCE) ar_at = i;
            if (pr->ops[i].kind == PO_CLIP) clip_at = i;
        }
        CHECK(ar_at < clip_at && !pr->ops[ar_at].per_micro, "the all-reduce comes once, before clipping");
        CHECK(p->clip == 1.0, "clip %g", p->clip);
        CHECK(p->schedule && strcmp(p->schedule, "lr.cosine(step, warmup = 10, total = 100, min_ratio = 0.1)") == 0,
              "schedule %s", p->schedule ? p->schedule : "(none)");
    }
    built_free(b);
    arena_free(&ar);
}

static void program_ramp(void) {
    Arena ar = {0};
    Built *b = build(
        program(&ar, "optim.sgd(lr = 0.1)", "  batch { global = 16, micro = 8, ramp = [(10, 32), (50, 64), (200, 128)] }\n"),
        NULL);
    const Plan *p = b->plan;
    CHECK(p && p->nprograms == 4, "a program per stage of the ramp");
    if (p && p->nprograms == 4) {
        static const int64_t first[4] = {0, 10, 50, 200}, last[4] = {9, 49, 99, 99}, acc[4] = {2, 4, 8, 16};
        for (int i = 0; i < 4; i++) {
            const PlanProgram *pr = &p->programs[i];
            CHECK(pr->first_step == first[i] && pr->last_step == last[i] && pr->accumulation == acc[i] &&
                      pr->loss_scale == 1.0 / (double)acc[i] && pr->global == 8 * acc[i],
                  "program %d: steps %lld..%lld, accumulation %lld, scale %g", i, (long long)pr->first_step,
                  (long long)pr->last_step, (long long)pr->accumulation, pr->loss_scale);
        }
        CHECK(p->programs[3].first_step >= p->steps, "the last stage starts past the run: never reached");
    }
    built_free(b);
    /* a ramp entry at step 0 replaces the base batch */
    b = build(program(&ar, "optim.sgd(lr = 0.1)", "  batch { global = 8, micro = 8, ramp = [(0, 16)] }\n"), NULL);
    p = b->plan;
    CHECK(p && p->nprograms == 1 && p->programs[0].accumulation == 2 && p->programs[0].first_step == 0,
          "ramp at step 0: one program with accumulation 2");
    built_free(b);
    arena_free(&ar);
}

/* ---- the optimizers against C ---------------------------------------------------------------- */

typedef enum { OPT_ADAMW, OPT_SGD, OPT_LION, OPT_LAMB } OptKind;

typedef struct OptCase {
    OptKind kind;
    const char *source; /* the train block's optimizer */
    double lr, b1, b2, eps, wd, momentum;
} OptCase;

/* One step of each optimizer over one parameter tensor of len values, as PyTorch writes it. */
static void c_step(const OptCase *oc, double lr, double t, double *p, const double *g, double *m, double *v, int64_t len) {
    switch (oc->kind) {
    case OPT_ADAMW: {
        double bc1 = 1 - pow(oc->b1, t), bc2 = 1 - pow(oc->b2, t), step = lr / bc1;
        for (int64_t i = 0; i < len; i++) {
            p[i] *= 1 - lr * oc->wd;
            m[i] = oc->b1 * m[i] + (1 - oc->b1) * g[i];
            v[i] = oc->b2 * v[i] + (1 - oc->b2) * g[i] * g[i];
            double denom = sqrt(v[i]) / sqrt(bc2) + oc->eps;
            p[i] -= step * m[i] / denom;
        }
        break;
    }
    case OPT_SGD: /* torch.optim.SGD, dampening 0: the buffer starts as the first gradient */
        for (int64_t i = 0; i < len; i++) {
            double d = g[i] + oc->wd * p[i];
            m[i] = t == 1 ? d : oc->momentum * m[i] + d;
            p[i] -= lr * m[i];
        }
        break;
    case OPT_LION: /* lion-pytorch */
        for (int64_t i = 0; i < len; i++) {
            p[i] *= 1 - lr * oc->wd;
            double c = oc->b1 * m[i] + (1 - oc->b1) * g[i];
            p[i] -= lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
            m[i] = oc->b2 * m[i] + (1 - oc->b2) * g[i];
        }
        break;
    case OPT_LAMB: { /* the Adam direction plus decay, scaled by ||p|| / ||u|| over this tensor */
        double bc1 = 1 - pow(oc->b1, t), bc2 = 1 - pow(oc->b2, t);
        double *u = calloc((size_t)len + 1, sizeof(double));
        if (!u) exit(1);
        double pn = 0, un = 0;
        for (int64_t i = 0; i < len; i++) {
            m[i] = oc->b1 * m[i] + (1 - oc->b1) * g[i];
            v[i] = oc->b2 * v[i] + (1 - oc->b2) * g[i] * g[i];
            u[i] = (m[i] / bc1) / (sqrt(v[i] / bc2) + oc->eps) + oc->wd * p[i];
            pn += p[i] * p[i];
            un += u[i] * u[i];
        }
        pn = sqrt(pn);
        un = sqrt(un);
        double ratio = pn > 0 && un > 0 ? pn / un : 1.0;
        for (int64_t i = 0; i < len; i++) p[i] -= lr * ratio * u[i];
        free(u);
        break;
    }
    }
}

/* |got - want| <= 1e-12 relative (exact zeros match exactly). */
static int close_rel(double got, double want) {
    double scale = fabs(want) > fabs(got) ? fabs(want) : fabs(got);
    return fabs(got - want) <= 1e-12 * scale;
}

static void run_optimizer(const OptCase *oc, const char *name) {
    Arena ar = {0};
    Built *b = build(program(&ar, oc->source, ""), NULL);
    if (!b->tb || !b->plan) {
        CHECK(0, "%s: the program did not build", name);
        built_free(b);
        arena_free(&ar);
        return;
    }
    const Graph *ug = b->tb->update;
    const GraphUpdate *u = ug->update;
    int nstate = oc->kind == OPT_ADAMW || oc->kind == OPT_LAMB ? 2 : 1;
    CHECK(u->nstate == nstate, "%s: %d state variables", name, u->nstate);
    CHECK(u->lr_in >= 0 && u->lr_base == oc->lr, "%s: lr input with base %g", name, u->lr_base);
    if (u->nstate != nstate || u->lr_in < 0) {
        built_free(b);
        arena_free(&ar);
        return;
    }
    int64_t n = u->n;
    uint64_t rng = 0x9E3779B97F4A7C15ull + (uint64_t)oc->kind;
    /* the graph's state (p, m, v over the flat layout) and the C state (per parameter, packed) */
    double *p = arena_alloc(&ar, sizeof(double) * (size_t)n), *m = arena_alloc(&ar, sizeof(double) * (size_t)n);
    double *v = arena_alloc(&ar, sizeof(double) * (size_t)n), *g = arena_alloc(&ar, sizeof(double) * (size_t)n);
    double *cp = arena_alloc(&ar, sizeof(double) * (size_t)n), *cm = arena_alloc(&ar, sizeof(double) * (size_t)n);
    double *cv = arena_alloc(&ar, sizeof(double) * (size_t)n);
    for (int s = 0; s < u->nsegs; s++)
        for (int64_t i = 0; i < u->seg_len[s]; i++) {
            int64_t k = u->seg_off[s] + i;
            /* parameter e (the last) starts at zero: LAMB's ratio of 1 for a zero norm */
            p[k] = cp[k] = s == u->nsegs - 1 ? 0.0 : tp_uniform(&rng, -1, 1);
        }
    static const double sched[3] = {0.5, 1.0, 0.8};
    double worst = 0;
    int bad = 0;
    for (int step = 1; step <= 3 && !bad; step++) {
        for (int s = 0; s < u->nsegs; s++)
            for (int64_t i = 0; i < u->seg_len[s]; i++) g[u->seg_off[s] + i] = tp_uniform(&rng, -2, 2);
        double lr = oc->lr * sched[step - 1], t = step;
        double **leaves = arena_alloc(&ar, sizeof(double *) * (size_t)ug->n);
        leaves[u->p_in] = p;
        leaves[u->g_in] = g;
        leaves[u->lr_in] = &lr;
        leaves[u->t_in] = &t;
        leaves[u->state_in[0]] = m;
        if (nstate == 2) leaves[u->state_in[1]] = v;
        double **vals = ref_run(ug, leaves, &ar);
        if (!vals) {
            CHECK(0, "%s: ref_run failed", name);
            break;
        }
        for (int s = 0; s < u->nsegs; s++) {
            int64_t off = u->seg_off[s];
            c_step(oc, lr, t, cp + off, g + off, cm + off, cv + off, u->seg_len[s]);
        }
        const double *np = vals[u->p_out], *nm = vals[u->state_out[0]];
        const double *nv = nstate == 2 ? vals[u->state_out[1]] : NULL;
        for (int64_t k = 0; k < n && !bad; k++) {
            int in_seg = 0;
            for (int s = 0; s < u->nsegs; s++) in_seg |= k >= u->seg_off[s] && k < u->seg_off[s] + u->seg_len[s];
            if (!in_seg) {
                if (np[k] != 0 || nm[k] != 0 || (nv && nv[k] != 0)) {
                    CHECK(0, "%s step %d: padding element %lld is not 0", name, step, (long long)k);
                    bad = 1;
                }
                continue;
            }
            double pairs[3][2] = {{np[k], cp[k]}, {nm[k], cm[k]}, {nv ? nv[k] : 0, nv ? cv[k] : 0}};
            for (int j = 0; j < 3; j++) {
                double d = fabs(pairs[j][0] - pairs[j][1]) / (fabs(pairs[j][1]) > 0 ? fabs(pairs[j][1]) : 1);
                if (d > worst) worst = d;
                if (!close_rel(pairs[j][0], pairs[j][1])) {
                    CHECK(0, "%s step %d: element %lld of %s is %.17g, C says %.17g", name, step, (long long)k,
                          j == 0   ? "p"
                          : j == 1 ? "state 0"
                                   : "state 1",
                          pairs[j][0], pairs[j][1]);
                    bad = 1;
                    break;
                }
            }
        }
        /* the next step starts from the graph's results */
        memcpy(p, np, sizeof(double) * (size_t)n);
        memcpy(m, nm, sizeof(double) * (size_t)n);
        if (nv) memcpy(v, nv, sizeof(double) * (size_t)n);
    }
    printf("# %s: 3 steps over %d parameters, max relative difference %.2e\n", name, u->nsegs, worst);
    built_free(b);
    arena_free(&ar);
}

static void optimizer_adamw(void) {
    OptCase oc = {
        OPT_ADAMW, "optim.adamw(lr = 0.01, betas = (0.8, 0.95), eps = 1e-6, weight_decay = 0.1)", 0.01, 0.8, 0.95, 1e-6, 0.1, 0};
    run_optimizer(&oc, "adamw");
}

static void optimizer_sgd(void) {
    OptCase oc = {OPT_SGD, "optim.sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)", 0.05, 0, 0, 0, 0.01, 0.9};
    run_optimizer(&oc, "sgd");
}

static void optimizer_lion(void) {
    OptCase oc = {OPT_LION, "optim.lion(lr = 0.001, betas = (0.85, 0.98), weight_decay = 0.2)", 0.001, 0.85, 0.98, 0, 0.2, 0};
    run_optimizer(&oc, "lion");
}

static void optimizer_lamb(void) {
    OptCase oc = {
        OPT_LAMB, "optim.lamb(lr = 0.01, betas = (0.9, 0.99), eps = 1e-6, weight_decay = 0.05)", 0.01, 0.9, 0.99, 1e-6, 0.05, 0};
    run_optimizer(&oc, "lamb");
}

/* G_SEG_NORM by itself: each element gets its segment's norm, padding 0. */
static void seg_norm_ref(void) {
    Arena ar = {0};
    Graph *g = graph_new(&ar);
    static const int64_t off[2] = {0, 4}, len[2] = {2, 3};
    static const char *const names[2] = {"a", "b"};
    GraphUpdate *u = arena_alloc(&ar, sizeof(GraphUpdate));
    u->n = 8;
    u->nsegs = 2;
    u->seg_off = off;
    u->seg_len = len;
    u->seg_name = names;
    g->update = u;
    int64_t shape[1] = {8};
    int x = graph_add(g, G_INPUT, DT_F32, 1, shape, 0, NULL, span_none());
    graph_node(g, x)->name = "p";
    int y = graph_add(g, G_SEG_NORM, DT_F32, 1, shape, 1, &x, span_none());
    double xv[8] = {3, 4, 9, 9, 1, 2, 2, 9}, *leaves[2] = {xv, NULL};
    double **vals = ref_run(g, leaves, &ar);
    static const double want[8] = {5, 5, 0, 0, 3, 3, 3, 0};
    for (int i = 0; vals && i < 8; i++) CHECK(vals[y][i] == want[i], "element %d: %g, expected %g", i, vals[y][i], want[i]);
    arena_free(&ar);
}

/* ---- user errors ---------------------------------------------------------------------------- */

/* Builds src and expects it refused with a message containing `want`. */
static void expect_error(const char *src, const char *want) {
    capture_begin();
    Built *b = build(src, NULL);
    const char *err = capture_end();
    CHECK(!b->plan, "the program is refused");
    if (!strstr(err, want)) {
        CHECK(0, "the message does not say '%s'", want);
        unit_detail("stderr", err);
    }
    built_free(b);
}

static void errors_update(void) {
    Arena ar = {0};
    const char *opt_sum = "optimizer o(lr) {\n  fn update(p, g, t) { p = p - lr * g / sum(g) }\n}\n";
    expect_error(arena_printf(&ar, "%s%s", opt_sum, program(&ar, "o(lr = 0.1)", "") + strlen("import optim\nimport lr\n")),
                 "building the optimizer graph: 'sum' inside an optimizer's update");
    const char *opt_if = "optimizer o(lr) {\n  fn update(p, g, t) {\n    if t > 1 { p = p - lr * g }\n  }\n}\n";
    expect_error(arena_printf(&ar, "%s%s", opt_if, program(&ar, "o(lr = 0.1)", "") + strlen("import optim\nimport lr\n")),
                 "an 'if' on a value known only when the step runs");
    const char *opt_nolr = "optimizer o(rate) {\n  fn update(p, g, t) { p = p - rate * g }\n}\n";
    expect_error(arena_printf(&ar, "import lr\n%s%s", opt_nolr,
                              program(&ar, "o(rate = 0.1)", "  lr = lr.cosine(warmup = 1, total = 10)\n") +
                                  strlen("import optim\nimport lr\n")),
                 "scales the optimizer's hyper-parameter 'lr', but optimizer 'o' has none");
    arena_free(&ar);
}

/* A bf16 program's parameter casts' region (plan.h, PH_PCAST): the update's cast(p_new) over the
 * whole region at 0, the step's casts of whole parameters at their offset / 2 (m's, read by the
 * product), their launch marked 2; plan_verify notices each misplaced; an f32 program has none. */
static void pcast_region(void) {
    Arena ar = {0};
    Built *f = build(program(&ar, "optim.adamw(lr = 1e-3)", ""), NULL);
    CHECK(f->plan && f->plan->mem.pcast_bytes == 0 && f->tb->update->update->cast_out < 0, "f32: no parameter casts");
    built_free(f);
    /* w's gather reads the parameter itself; m, a product's operand, is read through k0's cast */
    Built *b = build("import optim\n"
                     "model Q(n = 5) {\n  w = param f32[n, 3] ~ normal(0, 1)\n  m = param f32[3, 3] ~ normal(0, 1)\n"
                     "  fn forward(idx: i32[B, T]) -> f32[B, T, 3] {\n    return w[idx] @ m\n  }\n}\n"
                     "train t {\n  model = Q()\n  data = tokens(\"x.bin\", seq = 4)\n"
                     "  loss = cross_entropy(model(data.x), data.y)\n  optimizer = optim.adamw(lr = 1e-3)\n"
                     "  precision = bf16\n  steps = 100\n}\n",
                     NULL);
    if (b->plan) {
        PlanMemory *m = &b->plan->mem;
        const GraphUpdate *u = b->tb->update->update;
        CHECK(m->pcast_bytes == m->param_bytes / 2 && m->pcast_dt == DT_BF16, "the region: %lld bytes for %lld of parameters",
              (long long)m->pcast_bytes, (long long)m->param_bytes);
        PlanPhaseMem *up = &m->phase[PLAN_UPDATE], *st = &m->phase[PLAN_STEP];
        int ub = u->cast_out >= 0 ? up->r->node_buffer[u->cast_out] : -1;
        CHECK(ub >= 0 && up->slots[ub].home == PH_PCAST && up->slots[ub].offset == 0 && up->slots[ub].bytes == u->n * 2,
              "the update's cast(p_new) fills the region from 0");
        int sb = -1, pi = -1;
        for (int i = 0; i < st->r->nbuffers && sb < 0; i++)
            if (st->slots[i].home == PH_PCAST) sb = i;
        const FuseBuffer *fb = sb >= 0 ? &st->r->buffers[sb] : NULL;
        const GNode *cn = fb ? graph_node(st->r->g, fb->node) : NULL;
        for (int k = 0; cn && k < m->nparams; k++)
            if (strcmp(m->params[k].name, graph_node(st->r->g, cn->in[0])->name) == 0) pi = k;
        CHECK(m->npcast > 0 && pi >= 0 && st->slots[sb].offset == m->params[pi].offset / 2,
              "a step cast at its parameter's offset / 2");
        int li = -1;
        for (int l = 0; m->param_only && l < st->r->nlaunches; l++)
            if (m->param_only[l] == 2) li = l;
        CHECK(li >= 0 && m->nparam_skip == 1, "the cast launch is skipped when the region is current");
        CHECK(plan_verify(b->plan, NULL) == 0, "the plan verifies");
        if (sb >= 0) {
            st->slots[sb].offset += PLAN_ALIGN;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a step cast off its parameter's place");
            st->slots[sb].offset -= PLAN_ALIGN;
        }
        if (ub >= 0) {
            up->slots[ub].offset += PLAN_ALIGN;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports the update's casts off the region's start");
            up->slots[ub].offset -= PLAN_ALIGN;
        }
        if (li >= 0) {
            m->param_only[li] = 1;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a cast launch marked against its buffers");
            m->param_only[li] = 2;
        }
        CHECK(plan_verify(b->plan, NULL) == 0, "the plan verifies again once restored");
    } else {
        CHECK(0, "the bf16 program did not build");
    }
    built_free(b);
    arena_free(&ar);
}

/* plan_verify notices a broken plan. */
static void verify_catches(void) {
    Arena ar = {0};
    Built *b = build(program(&ar, "optim.adamw(lr = 1e-3)", ""), NULL);
    if (b->plan) {
        PlanMemory *m = &b->plan->mem;
        PlanPhaseMem *st = &m->phase[PLAN_STEP];
        int a = -1, c = -1;
        for (int i = 0; i < st->r->nbuffers && c < 0; i++) {
            const PlanSlot *si = &st->slots[i];
            if (si->home != PH_ARENA) continue;
            if (a < 0) a = i;
            else if (!(si->last < st->slots[a].first || st->slots[a].last < si->first)) c = i;
        }
        CHECK(a >= 0 && c >= 0, "two arena buffers live together");
        if (c >= 0) {
            int64_t saved = st->slots[c].offset;
            st->slots[c].offset = st->slots[a].offset;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports two live buffers sharing bytes");
            st->slots[c].offset = saved;
        }
        CHECK(st->nwrites > 0, "the step adds gradients");
        if (st->nwrites > 0) {
            int64_t saved = st->writes[0].offset;
            st->writes[0].offset = m->param_bytes;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a gradient added past its region");
            st->writes[0].offset = saved;
        }
        /* ZeRO-3's schedule (plan_gather.c): a gather released before a launch that reads it, a
         * window that is not what the gathers hold, a range past the region */
        PlanGatherSched *gs = &m->gather[PLAN_GATHER_STEP];
        CHECK(gs->n > 0 && m->gather[PLAN_GATHER_LOSS].n > 0, "the step and the loss have parameter gathers");
        if (gs->n > 0) {
            PlanGather *g = &gs->g[gs->n - 1];
            int done = g->done;
            g->done = g->need - 1;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a gather released before its use");
            g->done = done;
            gs->window--;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a window the gathers exceed");
            gs->window++;
            gs->window_pages--; /* the pages of the target's page the gathers cover (--zero3-page) */
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a window of pages the gathers exceed");
            gs->window_pages++;
            CHECK(m->gather_page == 4096, "the CPU's plan gathers by 4 KiB pages (%lld)", (long long)m->gather_page);
            m->gather_page = 3000;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a page that is not a power of two");
            m->gather_page = 4096;
            int64_t hi = g->hi;
            g->hi = m->param_bytes / 4 + 16;
            CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a gather past the region");
            g->hi = hi;
        }
        int64_t peak = st->peak;
        st->peak = 0;
        CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports buffers past the phase's peak");
        st->peak = peak;
        CHECK(plan_verify(b->plan, NULL) == 0, "the plan verifies again once restored");
        m->params[1].offset += PLAN_ALIGN;
        CHECK(plan_verify(b->plan, NULL) > 0, "plan_verify reports a parameter off its place");
    } else {
        CHECK(0, "the program did not build");
    }
    built_free(b);
    arena_free(&ar);
}

int main(void) {
    RUN(assign_exact);
    RUN(assign_random);
    RUN(assign_large);
    RUN(regions_contiguous);
    RUN(program_accumulation);
    RUN(program_ramp);
    RUN(seg_norm_ref);
    RUN(optimizer_adamw);
    RUN(optimizer_sgd);
    RUN(optimizer_lion);
    RUN(optimizer_lamb);
    RUN(errors_update);
    RUN(verify_catches);
    RUN(pcast_region);
    return unit_finish();
}
