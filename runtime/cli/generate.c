/* generate.c - `PROG generate`: continue a prompt one token at a time, greedily or by temperature
 * and top-k sampling (see rt_exec.h; docs/runtime.md, "generate").
 *
 * Pipeline position: a command of the executable. With the KV cache (the program's forward_chunk,
 * on the CPU, unless --no-cache) the prompt runs through the cached engine
 * (runtime/serve/engine_cached.c) in chunks of --prefill-chunk tokens, then each new token alone
 * against the cached keys and values: O(context) attention and O(1) everything else per token.
 * Otherwise, and for the tokens past the cache's context (logits_seq), each new token calls
 * forward_logits (B = 1, T = logits_seq) on the last T tokens of the context (the prompt plus what
 * was generated), left-aligned with zeros after them; a causal model's logits at position len - 1
 * depend only on x[0, len). That is the reference path, O(T) work per token. On the CPU both give
 * the same logits bit for bit (tests/exec: generate-cache-*).
 *
 * --print-logits is the check of those forwards: instead of generating, it prints the logits after
 * each prefix of the prompt (len = 1, 2, ..., one line of vocab numbers each, %.9g so that a
 * float round-trips), which tests/run.sh compares with the loss the training forward computes
 * on the same tokens (forward_logits, so without --prefill-chunk it checks the recompute path).
 * With --prefill-chunk C it checks the cache instead: the prompt goes through the cache C tokens a
 * step, and it prints the prefixes that end a step (C, 2C, ..., and the whole prompt).
 *
 * Sampling draws the token at position pos with rt_sample_u(seed, pos): the first 53-bit uniform
 * of Philox stream pos of the `samp` domain keyed by --seed, so the same seed gives the same tokens
 * on any machine and thread count, and `serve` (which samples the same way) gives the same tokens
 * as generate for the same prompt and seed, whatever else is in its batch. Candidates are ordered
 * by logit, ties by lower id, and the probabilities are computed in double. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "rt_exec.h"

/* ---- sampling ----------------------------------------------------------------------------------- */

typedef struct RtCand {
    float logit;
    int32_t id;
} RtCand;

static int rt_cmp_cand(const void *a, const void *b) {
    const RtCand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

_Static_assert(sizeof(RtCand) == RT_SAMPLE_SCRATCH, "rt_exec.h's RT_SAMPLE_SCRATCH is a candidate's size");

double rt_sample_u(uint64_t seed, int64_t pos) {
    RtRng rng;
    rt_rng_init(&rng, seed, RT_RNG_DOMAIN_SAMPLE, (uint64_t)pos);
    return rt_rng_f64(&rng);
}

int32_t rt_sample_token(const float *logits, int64_t vocab, double temperature, int64_t top_k, double top_p, double u,
                        void *scratch) {
    if (temperature <= 0 || top_k == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    RtCand *c = scratch;
    for (int64_t i = 0; i < vocab; i++) c[i] = (RtCand){logits[i], (int32_t)i};
    qsort(c, (size_t)vocab, sizeof *c, rt_cmp_cand);
    int64_t k = top_k > 0 && top_k < vocab ? top_k : vocab;
    /* softmax(logit / temperature) over the k candidates, in double, largest first */
    double top = (double)c[0].logit, total = 0;
    for (int64_t i = 0; i < k; i++) total += exp(((double)c[i].logit - top) / temperature);
    if (top_p < 1) { /* the nucleus: the fewest likeliest candidates whose mass reaches top_p (at least one) */
        double mass = 0, keep = 0;
        int64_t n = 0;
        while (n < k) {
            double w = exp(((double)c[n].logit - top) / temperature);
            mass += w / total, keep += w, n++;
            if (mass >= top_p) break;
        }
        k = n, total = keep;
    }
    double target = u * total, acc = 0;
    for (int64_t i = 0; i < k; i++) {
        acc += exp(((double)c[i].logit - top) / temperature);
        if (target < acc) return c[i].id;
    }
    return c[k - 1].id; /* u * total rounded up to the sum */
}

/* The index of the first NaN or infinite logit, or -1. */
static int64_t rt_first_nonfinite(const float *logits, int64_t vocab) {
    for (int64_t i = 0; i < vocab; i++)
        if (!isfinite(logits[i])) return i;
    return -1;
}

/* ---- the command -------------------------------------------------------------------------------- */

/* forward_logits on the last T tokens of ctx[0, len), left-aligned, zeros after them. */
static RtStatus rt_logits_at(const RtProgram *p, RtExec *x, const int32_t *ctx, int64_t len, uint64_t seed, float *logits,
                             RtError *e) {
    int64_t T = p->logits_seq, n = len < T ? len : T;
    memset(x->x, 0, (size_t)T * sizeof *x->x);
    memcpy(x->x, ctx + len - n, (size_t)n * sizeof *x->x);
    RtStatus st = rt_exec_batch(x, T, e);
    if (st != RT_OK) return st;
    RtStep s = rt_exec_step(x, e);
    s.B = 1, s.T = T, s.len = n, s.logits = logits, s.seed = seed;
    return rt_exec_call(x, RT_EXEC_FORWARD_LOGITS, &s);
}

static void rt_print_logits(const float *logits, int64_t V) {
    for (int64_t j = 0; j < V; j++) printf("%s%.9g", j ? " " : "", (double)logits[j]);
    printf("\n");
}

/* One sequence in the cached engine: its blocks are 0, 1, ... of a pool of its own. */
typedef struct RtGenCache {
    RtEngine eng;
    int32_t *table;
    int on;
} RtGenCache;

static RtStatus rt_cache_open(RtGenCache *c, const RtProgram *p, RtExec *x, const RtOptions *o, RtError *e) {
    memset(c, 0, sizeof *c);
    if (o->no_cache || !p->forward_chunk) return RT_OK; /* the recompute path */
    RtStatus st = rt_engine_open_cached(&c->eng, x, p->kv.block, e);
    if (st == RT_OK) st = rt_engine_pool(&c->eng, p->kv.max_blocks, e);
    if (st == RT_OK) {
        c->table = malloc((size_t)p->kv.max_blocks * sizeof *c->table);
        if (!c->table) st = rt_fail(e, RT_ERR_NOMEM, "cannot allocate a block table");
        for (int64_t b = 0; c->table && b < p->kv.max_blocks; b++) c->table[b] = (int32_t)b;
    }
    c->on = st == RT_OK;
    return st;
}

/* Positions [start, start + n) of ctx into the cache; logits (may be NULL) of the last. */
static RtStatus rt_cache_step(RtGenCache *c, const int32_t *ctx, int64_t start, int64_t n, float *logits, RtError *e) {
    RtEngineSeq q = {.id = 0,
                     .tokens = ctx,
                     .start = start,
                     .n = n,
                     .block_table = c->table,
                     .nblocks = c->eng.x->prog->kv.max_blocks,
                     .logits = logits};
    return rt_engine_step(&c->eng, &q, 1, e);
}

int rt_cmd_generate(const RtProgram *p, const RtOptions *o) {
    RtError e;
    rt_error_clear(&e);
    RtExec x = {0};
    float *logits = NULL;
    RtCand *scratch = NULL;
    int32_t *ctx = NULL;
    RtGenCache cache = {0};
    int code = 1;
    RtStatus st = RT_OK;
    const char *weights = o->weights ? o->weights : p->generate.weights;
    int64_t V = p->train.vocab;
    if (!p->forward_logits)
        st = rt_fail(&e, RT_ERR_ARG, "this program cannot generate: it was compiled without a logits forward (mbtc warned why)");
    else if (!weights) st = rt_fail(&e, RT_ERR_ARG, "generate needs --weights F.safetensors (the program names no weights file)");
    if (st == RT_OK) st = rt_exec_open(&x, p, o->threads, rt_device_want(o), &e);
    if (st == RT_OK) {
        int64_t unused = 0;
        st = rt_weights_load(p, x.params, weights, &unused, &e);
        if (st == RT_OK && unused > 0)
            fprintf(stderr, "%s: note: %lld tensors of '%s' are not parameters of this program and were not read\n", o->prog,
                    (long long)unused, weights);
    }
    if (st == RT_OK) st = rt_exec_push(&x, &e);
    if (st == RT_OK) {
        logits = malloc((size_t)V * sizeof *logits);
        scratch = malloc((size_t)V * sizeof *scratch);
        ctx = malloc((size_t)(o->nprompt + o->max_tokens) * sizeof *ctx);
        if (!logits || !scratch || !ctx)
            st = rt_fail_errno(&e, ENOMEM, "cannot allocate for generating %lld tokens", (long long)o->max_tokens);
    }
    if (st == RT_OK) st = rt_cache_open(&cache, p, &x, o, &e);
    if (st != RT_OK) goto done;
    memcpy(ctx, o->prompt, (size_t)o->nprompt * sizeof *ctx);
    int64_t C = o->prefill_chunk > 0 ? o->prefill_chunk : p->kv.rows; /* tokens of the prompt a cached step */
    if (o->print_logits && cache.on && o->prefill_chunk_given && o->nprompt <= cache.eng.context) {
        for (int64_t start = 0; start < o->nprompt; start += C) {
            int64_t n = o->nprompt - start < C ? o->nprompt - start : C;
            st = rt_cache_step(&cache, ctx, start, n, logits, &e);
            if (st != RT_OK) {
                rt_error_context(&e, "the logits after prompt token %lld", (long long)(start + n));
                goto done;
            }
            rt_print_logits(logits, V);
        }
        code = 0;
        goto done;
    }
    if (o->print_logits) {
        for (int64_t len = 1; len <= o->nprompt; len++) {
            st = rt_logits_at(p, &x, ctx, len, o->seed, logits, &e);
            if (st != RT_OK) {
                rt_error_context(&e, "the logits after prompt token %lld", (long long)len);
                goto done;
            }
            rt_print_logits(logits, V);
        }
        code = 0;
        goto done;
    }
    int64_t len = o->nprompt;
    int64_t cached = 0; /* positions in the cache */
    for (int64_t i = 0; i < o->max_tokens; i++) {
        if (cache.on && len <= cache.eng.context) { /* the new positions [cached, len) through the cache */
            while (st == RT_OK && cached < len) {
                int64_t n = len - cached < C ? len - cached : C;
                st = rt_cache_step(&cache, ctx, cached, n, cached + n == len ? logits : NULL, &e);
                cached += n;
            }
        } else {
            st = rt_logits_at(p, &x, ctx, len, o->seed, logits, &e);
        }
        if (st != RT_OK) {
            rt_error_context(&e, "generating token %lld", (long long)(i + 1));
            goto done;
        }
        int64_t bad = rt_first_nonfinite(logits, V);
        if (bad >= 0) { /* NaN or Inf weights: no token is a choice, and token 0 would be printed for ever */
            st = rt_fail(&e, RT_ERR_ARG,
                         "generating token %lld: logit %lld is %g (not finite): the weights '%s' hold NaN or Inf values, "
                         "or the model overflows on this prompt",
                         (long long)(i + 1), (long long)bad, (double)logits[bad], weights);
            goto done;
        }
        double u = rt_sample_u(o->seed, len); /* keyed by the new token's position */
        int32_t tok = rt_sample_token(logits, V, o->temperature, o->top_k, o->top_p, u, scratch);
        ctx[len++] = tok;
        printf("%s%d", i ? " " : "", (int)tok);
    }
    printf("\n");
    code = 0;
done:
    if (code != 0) {
        fflush(stdout);
        fprintf(stderr, "%s: %s\n", o->prog, e.msg);
    }
    free(logits);
    free(scratch);
    free(ctx);
    rt_engine_close(&cache.eng);
    free(cache.table);
    rt_exec_close(&x);
    return code;
}
