/* bigram_program.c - a hand-written program on the RtProgram ABI (runtime/rt_program.h): a bigram
 * language model, written in plain C the way mbtc's generated code will be shaped, so that the
 * runtime's executable side (command line, train loop, logging, weights, generation) can be built
 * and tested before the code generator exists.
 *
 * Pipeline position: stands in for the object compiler/host will emit. The Makefile links it with
 * build/libmbtrt.a (whose main.c calls rt_main(&mbt_program)) into build/tests/bigram, and, with
 * -DBIGRAM_MICRO=16 -DBIGRAM_GLOBAL=16, into build/tests/bigram_micro16; tests/unit/test_rt_train.c
 * runs both. The equivalent .mbt program would be:
 *
 *     model Bigram(vocab = 64) {
 *       wte  = param f32[vocab, vocab] ~ normal(0, 0.02)   # row a: the logits after token a
 *       head = ...                                         # head.bias = param f32[vocab] ~ zeros
 *       fn forward(idx: i32[B, T]) -> f32[B, T, vocab] { return wte[idx] + head.bias }
 *     }
 *     train bigram {
 *       model = Bigram(); data = tokens("data/tiny_train.bin", seq = 64, val = "data/tiny_val.bin")
 *       loss = cross_entropy(model(data.x), data.y)
 *       optimizer = optim.adamw(lr = 0.05, betas = (0.9, 0.99)); lr = lr.cosine(warmup = 10, total = 300)
 *       batch { global = 16, micro = 4 }; clip = 0.05; steps = 300
 *     }
 *
 * How it computes, deterministically for any thread count. The logits of a position depend only
 * on its input token a, so a micro-batch is first counted (serially) into cnt[a][c], the number of
 * positions with input a and target c. Then, in parallel over rows a: the row's log-softmax (in
 * double), its loss sum_c cnt[a][c] * -log p_a(c), and its gradient n_a p_a - cnt[a] - which
 * only that thread writes into row a of wte's gradient, and keeps (per row) for the bias. Then, in
 * parallel over columns c, the bias gradient sums its column of the per-row terms in row order.
 * The micro-batch loss sums the per-row losses in row order. No float is ever summed across
 * threads in an order that depends on the split. */
#include <math.h>
#include <string.h>

#include "rt_program.h"

#ifndef BIGRAM_MICRO
#define BIGRAM_MICRO 4
#endif
#ifndef BIGRAM_GLOBAL
#define BIGRAM_GLOBAL 16
#endif

#define V 64 /* vocabulary: mbt-gendata's default */
#define SEQ 64
#define STEPS 300
#define WARMUP 10

/* ---- memory plan -------------------------------------------------------------------------------- */

/* Parameter region: wte [V, V] then head.bias [V] (offsets multiples of 16 floats). */
#define OFF_WTE 0
#define OFF_BIAS (V * V)
#define PARAM_FLOATS (V * V + V)
/* Optimizer state: AdamW's m then v, each shaped like the parameter region. */
#define STATE_FLOATS (2 * PARAM_FLOATS)
/* Arena: counts, row totals, per-row losses, per-row bias-gradient terms (64-byte aligned). */
#define AR_CNT 0                   /* int32 [V, V] */
#define AR_N (AR_CNT + V * V * 4)  /* int32 [V] */
#define AR_LOSS (AR_N + V * 4)     /* double [V] */
#define AR_DBIAS (AR_LOSS + V * 8) /* double [V, V] */
#define ARENA_BYTES (AR_DBIAS + V * V * 8)

typedef struct Bigram {
    RtStep *s;
    int32_t *cnt, *n;
    double *loss_row, *dbias;
    double scale; /* loss_scale / (B * T): the mean over the micro-batch's tokens, seeded */
    int grad;
} Bigram;

static void bigram_count(Bigram *m) {
    memset(m->cnt, 0, V * V * sizeof *m->cnt);
    memset(m->n, 0, V * sizeof *m->n);
    int64_t bt = m->s->B * m->s->T;
    for (int64_t i = 0; i < bt; i++) {
        m->cnt[m->s->x[i] * V + m->s->y[i]]++;
        m->n[m->s->x[i]]++;
    }
}

/* ---- kernels ------------------------------------------------------------------------------------ */

static void bigram_rows(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    Bigram *m = ctx;
    const float *w = m->s->params + OFF_WTE, *bias = m->s->params + OFF_BIAS;
    float *gw = m->s->grads + OFF_WTE;
    for (int64_t a = begin; a < end; a++) {
        double *db = m->dbias + a * V;
        if (m->n[a] == 0) {
            m->loss_row[a] = 0;
            memset(db, 0, V * sizeof *db);
            continue;
        }
        double z[V], e[V], top = -INFINITY, sum = 0;
        for (int c = 0; c < V; c++) {
            z[c] = (double)w[a * V + c] + (double)bias[c];
            if (z[c] > top) top = z[c];
        }
        for (int c = 0; c < V; c++) {
            e[c] = exp(z[c] - top);
            sum += e[c];
        }
        double lse = top + log(sum), loss = 0;
        const int32_t *cnt = m->cnt + a * V;
        for (int c = 0; c < V; c++) {
            if (cnt[c]) loss -= cnt[c] * (z[c] - lse);
            if (m->grad) {
                double d = (double)m->n[a] * (e[c] / sum) - cnt[c]; /* d(sum of token losses) / d z[c] */
                gw[a * V + c] += (float)(m->scale * d);
                db[c] = d;
            }
        }
        m->loss_row[a] = loss;
    }
}

static void bigram_bias_grad(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    Bigram *m = ctx;
    float *gb = m->s->grads + OFF_BIAS;
    for (int64_t c = begin; c < end; c++) {
        double sum = 0;
        for (int a = 0; a < V; a++) sum += m->dbias[a * V + c];
        gb[c] += (float)(m->scale * sum);
    }
}

static RtStatus bigram_loss(RtStep *s, int grad) {
    Bigram m = {s,
                (int32_t *)(s->arena + AR_CNT),
                (int32_t *)(s->arena + AR_N),
                (double *)(s->arena + AR_LOSS),
                (double *)(s->arena + AR_DBIAS),
                s->loss_scale / (double)(s->B * s->T),
                grad};
    bigram_count(&m);
    rt_parallel_for(s->pool, V, bigram_rows, &m);
    if (grad) rt_parallel_for(s->pool, V, bigram_bias_grad, &m);
    double loss = 0;
    for (int a = 0; a < V; a++) loss += m.loss_row[a];
    s->loss = loss / (double)(s->B * s->T);
    return RT_OK;
}

static RtStatus bigram_forward_backward(RtStep *s) { return bigram_loss(s, 1); }

static RtStatus bigram_forward_loss(RtStep *s) { return bigram_loss(s, 0); }

static RtStatus bigram_forward_logits(RtStep *s) {
    int32_t a = s->x[s->len - 1];
    if (a < 0 || a >= V) return rt_fail(s->err, RT_ERR_ARG, "token id %d is not below the vocabulary size %d", (int)a, V);
    for (int c = 0; c < V; c++) s->logits[c] = s->params[OFF_WTE + a * V + c] + s->params[OFF_BIAS + c];
    return RT_OK;
}

/* ---- optimizer: AdamW, elementwise over the parameter region ------------------------------------ */

#define BETA1 0.9f
#define BETA2 0.99f
#define EPS 1e-8f
#define WEIGHT_DECAY 0.0f

typedef struct Adam {
    RtStep *s;
    float lr, bc1, bc2;
} Adam;

static void bigram_adamw(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const Adam *o = ctx;
    float *p = o->s->params, *g = o->s->grads, *mm = o->s->state, *vv = o->s->state + PARAM_FLOATS;
    for (int64_t i = begin; i < end; i++) {
        p[i] = p[i] - o->lr * WEIGHT_DECAY * p[i];
        mm[i] = BETA1 * mm[i] + (1 - BETA1) * g[i];
        vv[i] = BETA2 * vv[i] + (1 - BETA2) * g[i] * g[i];
        float mhat = mm[i] / o->bc1, vhat = vv[i] / o->bc2;
        p[i] = p[i] - o->lr * mhat / (sqrtf(vhat) + EPS);
    }
}

static RtStatus bigram_optimizer_update(RtStep *s) {
    Adam o = {s, (float)s->lr, (float)(1 - pow(BETA1, (double)s->t)), (float)(1 - pow(BETA2, (double)s->t))};
    rt_parallel_for(s->pool, PARAM_FLOATS, bigram_adamw, &o);
    return RT_OK;
}

/* lr.cosine(warmup = 10, total = 300, min_ratio = 0.1), as stdlib/lr.mbt defines it. */
static double bigram_lr_schedule(int64_t step) {
    const double min_ratio = 0.1;
    if (step < WARMUP) return (double)(step + 1) / WARMUP;
    if (step >= STEPS) return min_ratio;
    double progress = (double)(step - WARMUP) / (double)(STEPS - WARMUP);
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
}

/* ---- the descriptor ----------------------------------------------------------------------------- */

static const RtParam bigram_params[] = {
    {"wte.weight", 2, {V, V}, V *V, OFF_WTE, RT_INIT_NORMAL, 0.0, 0.02},
    {"head.bias", 1, {V}, V, OFF_BIAS, RT_INIT_ZEROS, 0.0, 0.0},
};

const RtProgram mbt_program = {
    .abi_version = RT_ABI_VERSION,
    .source = "tests/runtime/bigram_program.c (hand-written)",
    .train = {.name = "bigram",
              .micro = BIGRAM_MICRO,
              .seq = SEQ,
              .global = BIGRAM_GLOBAL,
              .accum = BIGRAM_GLOBAL / BIGRAM_MICRO,
              .data_ranks = 1,
              .steps = STEPS,
              .seed = 1337,
              .clip = 0.05,
              .vocab = V,
              .ctx = SEQ,
              .lr = 0.05,
              .data = "data/tiny_train.bin",
              .val_data = "data/tiny_val.bin",
              .shuffle = 1,
              .eval_every = 0,
              .eval_steps = 20},
    .generate = {.weights = NULL,
                 .temperature = 1.0,
                 .top_k = 0,
                 .max_tokens = 32,
                 .top_p = 1.0,
                 .batch_tokens = 2048,
                 .prefill_chunk = 512,
                 .batch_seqs = 128,
                 .kv_block = 16,
                 .kv_memory = 0.9,
                 .kv_dtype = "f32",
                 .port = 8000},
    .params = bigram_params,
    .nparams = 2,
    .param_floats = PARAM_FLOATS,
    .state_floats = STATE_FLOATS,
    .arena_bytes = ARENA_BYTES,
    .logits_seq = SEQ,
    .forward_backward = bigram_forward_backward,
    .forward_loss = bigram_forward_loss,
    .forward_logits = bigram_forward_logits,
    .optimizer_init = NULL,
    .optimizer_update = bigram_optimizer_update,
    .lr_schedule = bigram_lr_schedule,
};
