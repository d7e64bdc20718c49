/* sched.c - the serving scheduler: continuous batching with Sarathi-Serve's stall-free iterations,
 * the paged KV cache's block tables, preemption, sampling, and the request lifecycle.
 *
 * Pipeline position: runtime/serve/, between server.c (which submits requests and waits on their
 * tokens) and an RtEngine (engine.h). One thread runs the loop below; the HTTP connections' threads
 * only queue requests, mark them cancelled and read their tokens, all under one mutex.
 *
 * One iteration (docs/serve.md, "The scheduler"):
 *   1. decodes first: every running sequence whose prompt is done gets its one new token, in
 *      admission order, while the batch has room (batch.seqs sequences, batch.tokens tokens);
 *   2. then the running sequences still in their prompt get a chunk each, at most
 *      batch.prefill_chunk tokens and what the token budget has left;
 *   3. then waiting requests are admitted in arrival order (FIFO: the head is never skipped),
 *      each with its first chunk, after taking the longest cached prefix of its tokens.
 * A sequence that needs a new block when none is free preempts the most recently admitted running
 * sequence (vLLM's policy): its blocks are released and it goes back to the head of the waiting
 * queue with every token it has, to be recomputed (its prefix, if still cached, is found again).
 * Nothing is lost and nothing fails for want of blocks: the pool holds at least one full
 * context (server.c refuses a smaller one), so the oldest sequence can always go on alone.
 *
 * Sampling: the token at position p of a request is rt_sample_token at rt_sample_u(seed, p) - a
 * function of the request's seed, its tokens and the model alone, so the same request and seed
 * give the same tokens whatever else is in the batch, and the same as `generate`. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

const double sv_ttft_buckets[SV_NBUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                             0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
const double sv_itl_buckets[SV_NBUCKETS] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                            0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};

void sv_hist_add(SvHist *h, const double *bounds, double v) {
    int i = 0;
    while (i < SV_NBUCKETS && v > bounds[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

static void request_free(SvRequest *r) {
    free(r->tokens);
    free(r->logprob);
    free(r->stop_ids);
    for (int64_t i = 0; i < r->nstop_strs; i++) free(r->stop_strs[i]);
    free(r->stop_strs);
    rt_kv_seq_free(&r->kv);
    free(r);
}

void sv_request_unref(SvSched *s, SvRequest *r) {
    (void)s;
    if (--r->refs == 0) request_free(r);
}

void sv_generated_text(const SvSched *s, const SvRequest *r, char **buf, size_t *len, size_t *cap) {
    for (int64_t i = r->nprompt; i < r->ntok; i++) sv_tokenizer_piece(s->tok, r->tokens[i], buf, len, cap);
}

/* ---- queues ------------------------------------------------------------------------------------- */

static int waiting_push(SvSched *s, SvRequest *r, int front) {
    if (s->nwaiting == s->wcap) {
        int64_t cap = s->wcap ? s->wcap * 2 : 64;
        SvRequest **w = realloc(s->waiting, (size_t)cap * sizeof *w);
        if (!w) return -1;
        s->waiting = w, s->wcap = cap;
    }
    if (front) {
        memmove(s->waiting + 1, s->waiting, (size_t)s->nwaiting * sizeof *s->waiting);
        s->waiting[0] = r;
    } else {
        s->waiting[s->nwaiting] = r;
    }
    s->nwaiting++;
    return 0;
}

static void waiting_pop(SvSched *s) {
    memmove(s->waiting, s->waiting + 1, (size_t)(s->nwaiting - 1) * sizeof *s->waiting);
    s->nwaiting--;
}

static void running_remove(SvSched *s, int64_t i) {
    memmove(s->running + i, s->running + i + 1, (size_t)(s->nrunning - i - 1) * sizeof *s->running);
    s->nrunning--;
}

void sv_sched_submit(SvSched *s, SvRequest *r) {
    r->id = s->next_id++;
    if (!r->seed_given) r->seed ^= UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(r->id + 1);
    r->state = SV_WAITING;
    r->refs++;
    r->text_end = -1;
    if (waiting_push(s, r, 0) != 0) { /* out of memory: the request ends at once */
        r->state = SV_DONE, r->finish_reason = "cancelled";
        r->refs--;
        pthread_cond_broadcast(&s->progress);
        return;
    }
    s->m.prompt_tokens += r->nprompt;
    pthread_cond_signal(&s->work);
}

/* Ends r: frees its blocks, wakes its connection, drops the scheduler's reference. */
static void finish(SvSched *s, SvRequest *r, const char *reason) {
    rt_kv_release(s->kv, &r->kv);
    r->state = SV_DONE;
    r->finish_reason = reason;
    if (strcmp(reason, "cancelled") == 0) s->m.requests_cancelled++;
    else {
        s->m.requests_done++;
        sv_hist_add(&s->m.e2e, sv_itl_buckets, rt_now() - r->t_arrival);
    }
    pthread_cond_broadcast(&s->progress);
    sv_request_unref(s, r);
}

/* ---- one iteration ------------------------------------------------------------------------------ */

typedef struct SvSlot {
    SvRequest *r;
    int64_t n; /* new tokens this step */
} SvSlot;

/* Preempts the most recently admitted running sequence: its blocks go back to the pool (hashed
 * ones stay cached) and it waits at the head of the queue with its tokens, to be recomputed.
 * Removes it from the batch being built. Returns it. */
static SvRequest *preempt_last(SvSched *s, SvSlot *batch, int64_t *nb, int64_t *budget) {
    SvRequest *v = s->running[s->nrunning - 1];
    running_remove(s, s->nrunning - 1);
    for (int64_t i = 0; i < *nb; i++)
        if (batch[i].r == v) {
            *budget += batch[i].n;
            memmove(batch + i, batch + i + 1, (size_t)(*nb - i - 1) * sizeof *batch);
            (*nb)--;
            break;
        }
    rt_kv_release(s->kv, &v->kv);
    v->computed = 0;
    v->state = SV_WAITING;
    s->m.preemptions++;
    if (waiting_push(s, v, 1) != 0) finish(s, v, "cancelled"); /* out of memory for the queue */
    return v;
}

/* Blocks for r to cover `positions`, preempting from the most recently admitted running
 * sequence while the pool is short. 0, or -1 when r itself was preempted. */
static int grow_or_preempt(SvSched *s, SvRequest *r, int64_t positions, SvSlot *batch, int64_t *nb, int64_t *budget) {
    while (rt_kv_grow(s->kv, &r->kv, positions) != 0) {
        if (preempt_last(s, batch, nb, budget) == r) return -1;
    }
    return 0;
}

static int64_t schedule(SvSched *s, SvSlot *batch) {
    int64_t nb = 0, budget = s->cfg.batch_tokens, maxseq = s->cfg.batch_seqs;
    /* 1: decodes, in admission order */
    for (int64_t i = 0; i < s->nrunning && nb < maxseq && budget > 0; i++) {
        SvRequest *r = s->running[i];
        if (r->ntok - r->computed != 1) continue;
        if (grow_or_preempt(s, r, r->ntok, batch, &nb, &budget) != 0) break; /* r itself was the last: none after it */
        batch[nb++] = (SvSlot){r, 1};
        budget--;
    }
    /* 2: chunks of prompts already admitted */
    for (int64_t i = 0; i < s->nrunning && nb < maxseq && budget > 0; i++) {
        SvRequest *r = s->running[i];
        int64_t left = r->ntok - r->computed;
        if (left <= 1) continue;
        int64_t n = left < s->cfg.prefill_chunk ? left : s->cfg.prefill_chunk;
        if (n > budget) n = budget;
        if (grow_or_preempt(s, r, r->computed + n, batch, &nb, &budget) != 0) break;
        batch[nb++] = (SvSlot){r, n};
        budget -= n;
    }
    /* 3: admissions, FIFO; an admission never preempts */
    while (s->nwaiting > 0 && nb < maxseq && budget > 0) {
        SvRequest *r = s->waiting[0];
        if (r->cancelled) {
            waiting_pop(s);
            finish(s, r, "cancelled");
            continue;
        }
        int64_t hit = 0;
        if (r->kv.n == 0) hit = rt_kv_match_prefix(s->kv, &r->kv, r->tokens, r->ntok, r->ntok - 1);
        r->computed = hit;
        int64_t left = r->ntok - r->computed;
        int64_t n = left < s->cfg.prefill_chunk ? left : s->cfg.prefill_chunk;
        if (n > budget) n = budget;
        if (rt_kv_grow(s->kv, &r->kv, r->computed + n) != 0) {
            rt_kv_release(s->kv, &r->kv); /* not now: it keeps its place at the head */
            r->computed = 0;
            break;
        }
        if (r->t_first == 0) r->nprompt_cached = hit < r->nprompt ? hit : r->nprompt;
        s->m.prefix_hit_blocks += hit / s->kv_block_tokens;
        waiting_pop(s);
        r->state = SV_RUNNING;
        s->running[s->nrunning++] = r;
        batch[nb++] = (SvSlot){r, n};
        budget -= n;
    }
    return nb;
}

/* Does the generated text of r now contain a stop string? Then r->text_end is where it starts. */
static int hit_stop_string(SvSched *s, SvRequest *r) {
    if (r->nstop_strs == 0 || !s->tok) return 0;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    sv_generated_text(s, r, &buf, &len, &cap);
    int hit = 0;
    for (int64_t i = 0; i < r->nstop_strs && buf; i++) {
        const char *p = memmem(buf, len, r->stop_strs[i], strlen(r->stop_strs[i]));
        if (p && (!hit || p - buf < r->text_end)) r->text_end = p - buf, hit = 1;
    }
    free(buf);
    return hit;
}

/* After a step: advance each sequence, sample where the step gave logits, end what is done. */
static void advance(SvSched *s, SvSlot *batch, int64_t nb, double now) {
    int64_t V = s->engine->vocab;
    for (int64_t i = 0; i < nb; i++) {
        SvRequest *r = batch[i].r;
        r->computed += batch[i].n;
        rt_kv_commit(s->kv, &r->kv, r->tokens, r->computed);
        if (r->computed < r->ntok) continue; /* a mid-prompt chunk */
        if (r->cancelled) continue;          /* dropped below */
        const float *lg = s->logits + i * V;
        int32_t tok = rt_sample_token(lg, V, r->temperature, r->top_k, r->top_p, rt_sample_u(r->seed, r->ntok), s->scratch);
        if (r->ntok == r->cap) {
            int64_t cap = r->cap * 2;
            int32_t *t = realloc(r->tokens, (size_t)cap * sizeof *t);
            if (!t) {
                finish(s, r, "cancelled");
                continue;
            }
            r->tokens = t, r->cap = cap;
        }
        if (r->want_logprobs) { /* log-softmax of the logits at tok, in double: as exact as the logits */
            double *lp = realloc(r->logprob, (size_t)r->cap * sizeof *lp);
            if (!lp) {
                finish(s, r, "cancelled");
                continue;
            }
            r->logprob = lp;
            double mx = lg[0], sum = 0;
            for (int64_t v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
            for (int64_t v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
            lp[r->ntok] = (double)lg[tok] - mx - log(sum);
        }
        r->tokens[r->ntok++] = tok;
        s->m.generation_tokens++;
        if (r->t_first == 0) {
            r->t_first = now;
            sv_hist_add(&s->m.ttft, sv_ttft_buckets, now - r->t_arrival);
        } else {
            sv_hist_add(&s->m.itl, sv_itl_buckets, now - r->t_last);
        }
        r->t_last = now;
        int stop = 0;
        for (int64_t k = 0; k < r->nstop_ids; k++) stop |= r->stop_ids[k] == tok;
        if (!stop) stop = hit_stop_string(s, r);
        const char *reason = stop                                    ? "stop"
                             : r->ntok - r->nprompt >= r->max_tokens ? "length"
                             : r->ntok >= s->engine->context         ? "length"
                                                                     : NULL;
        if (reason) {
            for (int64_t k = 0; k < s->nrunning; k++)
                if (s->running[k] == r) running_remove(s, k);
            finish(s, r, reason);
        }
    }
    /* cancelled sequences leave whatever their state */
    for (int64_t k = s->nrunning - 1; k >= 0; k--) {
        SvRequest *r = s->running[k];
        if (r->cancelled) {
            running_remove(s, k);
            finish(s, r, "cancelled");
        }
    }
    pthread_cond_broadcast(&s->progress);
}

static void tps_sample(SvMetrics *m, double now) {
    int last = (m->tps_i + 15) % 16;
    if (now - m->tps_t[last] < 0.5) return;
    m->tps_t[m->tps_i] = now, m->tps_n[m->tps_i] = m->generation_tokens;
    m->tps_i = (m->tps_i + 1) % 16;
}

/* MBT_SERVE_GATHER=N (a test's hook, docs/serve.md): the first step waits until N requests are
 * waiting (at most 10 s), so that a test's burst lands in one batch whatever the threads' timing. */
static void gather_first(SvSched *s) {
    const char *env = getenv("MBT_SERVE_GATHER");
    long long n = env && *env ? strtoll(env, NULL, 10) : 0;
    if (n < 1) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (!s->failed && !s->stop && s->nwaiting < n)
        if (pthread_cond_timedwait(&s->work, &s->mu, &until) == ETIMEDOUT) break;
}

static void *sched_main(void *arg) {
    SvSched *s = arg;
    int64_t V = s->engine->vocab;
    SvSlot *batch = malloc((size_t)s->cfg.batch_seqs * sizeof *batch);
    RtEngineSeq *seqs = malloc((size_t)s->cfg.batch_seqs * sizeof *seqs);
    pthread_mutex_lock(&s->mu);
    gather_first(s);
    if (!batch || !seqs) s->failed = rt_fail_errno(&s->err, ENOMEM, "cannot allocate the scheduler's batch");
    for (;;) {
        while (!s->failed && s->nwaiting == 0 && s->nrunning == 0 && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (s->failed || (s->stop && s->nwaiting == 0 && s->nrunning == 0)) break;
        int64_t nb = schedule(s, batch);
        s->m.running = s->nrunning, s->m.waiting = s->nwaiting;
        if (nb == 0) { /* only cancelled requests were waiting */
            continue;
        }
        for (int64_t i = 0; i < nb; i++) {
            SvRequest *r = batch[i].r;
            seqs[i] = (RtEngineSeq){.id = r->id,
                                    .tokens = r->tokens,
                                    .start = r->computed,
                                    .n = batch[i].n,
                                    .block_table = r->kv.blocks,
                                    .nblocks = r->kv.n,
                                    .logits = r->computed + batch[i].n == r->ntok ? s->logits + i * V : NULL};
        }
        /* the step runs without the lock: connections may queue and cancel meanwhile (a cancel
         * is a flag; the tokens and tables it reads change only on this thread) */
        pthread_mutex_unlock(&s->mu);
        RtError err;
        rt_error_clear(&err);
        double t0 = rt_now();
        RtStatus st = rt_engine_step(s->engine, seqs, nb, &err);
        double now = rt_now();
        pthread_mutex_lock(&s->mu);
        if (st != RT_OK) {
            s->failed = st;
            s->err = err;
            break;
        }
        s->m.iterations++;
        int64_t decodes = 0;
        for (int64_t i = 0; i < nb; i++) decodes += batch[i].n == 1 && batch[i].r->computed >= batch[i].r->nprompt;
        if (decodes > s->m.decodes_max) s->m.decodes_max = decodes;
        s->m.engine_seconds += now - t0;
        if (decodes == nb) s->m.decode_seconds += now - t0, s->m.decode_tokens += nb;
        s->m.split_iterations += s->engine->calls - s->m.engine_calls > 1;
        s->m.engine_calls = s->engine->calls;
        s->m.call_rows_max = s->engine->call_rows_max;
        advance(s, batch, nb, now);
        s->m.running = s->nrunning, s->m.waiting = s->nwaiting;
        tps_sample(&s->m, now);
    }
    /* failed or stopped: whatever is left ends now */
    while (s->nrunning > 0) {
        SvRequest *r = s->running[s->nrunning - 1];
        s->nrunning--;
        finish(s, r, "cancelled");
    }
    while (s->nwaiting > 0) {
        SvRequest *r = s->waiting[0];
        waiting_pop(s);
        finish(s, r, "cancelled");
    }
    s->m.running = s->m.waiting = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    free(batch);
    free(seqs);
    return NULL;
}

/* ---- open and close ----------------------------------------------------------------------------- */

RtStatus sv_sched_open(SvSched *s, RtEngine *e, const SvTokenizer *tok, const SvConfig *cfg, RtError *err) {
    memset(s, 0, sizeof *s);
    s->engine = e, s->tok = tok, s->cfg = *cfg;
    s->kv_block_tokens = e->block;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->progress, NULL);
    RtStatus st = rt_kv_open(&s->kv, cfg->kv_blocks, e->block, err);
    if (st != RT_OK) return st;
    s->running = malloc((size_t)(cfg->batch_seqs + 1) * sizeof *s->running);
    s->logits = malloc((size_t)cfg->batch_seqs * (size_t)e->vocab * sizeof *s->logits);
    s->scratch = malloc((size_t)e->vocab * RT_SAMPLE_SCRATCH);
    if (!s->running || !s->logits || !s->scratch)
        return rt_fail_errno(err, ENOMEM, "cannot allocate the scheduler for %lld sequences", (long long)cfg->batch_seqs);
    s->m.started = rt_now();
    return RT_OK;
}

RtStatus sv_sched_start(SvSched *s, RtError *err) {
    int rc = pthread_create(&s->thread, NULL, sched_main, s);
    if (rc != 0) return rt_fail_errno(err, rc, "cannot start the scheduler's thread");
    s->thread_started = 1;
    return RT_OK;
}

void sv_sched_close(SvSched *s) {
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        s->thread_started = 0;
    }
    rt_kv_close(s->kv);
    s->kv = NULL;
    free(s->waiting);
    free(s->running);
    free(s->logits);
    free(s->scratch);
    s->waiting = NULL, s->running = NULL, s->logits = NULL, s->scratch = NULL;
}
