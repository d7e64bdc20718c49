/* serve.h - the serving runtime's internal interface: requests, the scheduler (sched.c), the
 * tokenizer (tokenizer.c) and the metrics the HTTP server (server.c) reports.
 *
 * Pipeline position: runtime/serve/. server.c parses HTTP requests into SvRequests and submits
 * them; the scheduler's thread batches them into engine steps (engine.h), samples, and wakes the
 * connections' threads as tokens arrive. docs/serve.md describes the policy. */
#ifndef MBT_SERVE_H
#define MBT_SERVE_H

#include <pthread.h>
#include <stdint.h>

#include "engine.h"

/* ==== the tokenizer (tokenizer.c) ============================================================== */

/* Byte-level BPE as GPT-2 and Llama 3 use it. */
typedef struct SvTokenizer SvTokenizer;

/* Reads a Hugging Face tokenizer.json, or GPT-2's vocab.json with merges.txt in the same folder. */
RtStatus sv_tokenizer_load(SvTokenizer **out, const char *path, RtError *err);
void sv_tokenizer_free(SvTokenizer *t);
/* UTF-8 text to ids (*ids malloc'd, *n of them); added special tokens written in the text are
 * matched as themselves. */
RtStatus sv_tokenizer_encode(const SvTokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n, RtError *err);
/* Appends the bytes of token id to *buf (grown with realloc); -1 for an id with no text. */
int sv_tokenizer_piece(const SvTokenizer *t, int32_t id, char **buf, size_t *len, size_t *cap);
int32_t sv_tokenizer_find(const SvTokenizer *t, const char *token); /* the id of a token's text, or -1 */
int64_t sv_tokenizer_vocab(const SvTokenizer *t);                   /* ids are below this */

/* ==== requests ================================================================================= */

typedef enum SvState { SV_WAITING, SV_RUNNING, SV_DONE } SvState;

typedef struct SvRequest {
    int64_t id;
    /* what was asked */
    int64_t nprompt;
    int64_t max_tokens;
    double temperature, top_p;
    int64_t top_k;
    uint64_t seed;
    int seed_given;    /* else the scheduler mixes the request's id into the server's seed */
    int32_t *stop_ids; /* generation ends after any of these tokens (included in the output) */
    int64_t nstop_ids;
    char **stop_strs; /* generation ends before any of these texts (a tokenizer is needed) */
    int64_t nstop_strs;
    /* the sequence: the prompt, then what was generated (the scheduler's; read under the lock) */
    int32_t *tokens;
    int64_t ntok, cap;
    /* with `logprobs` asked: logprob[i], the natural log of the probability the model gave token i
     * (i >= nprompt; the logits' log-softmax in double), sized like tokens; else NULL */
    int want_logprobs;
    double *logprob;
    int64_t computed; /* positions whose keys and values are in the cache */
    RtKvSeq kv;
    SvState state;
    int cancelled;             /* the client went away: the scheduler drops it and frees its blocks */
    const char *finish_reason; /* "stop", "length" or "cancelled" once done */
    int64_t text_end;          /* with stop strings: the bytes of generated text to return (-1: all) */
    int64_t nprompt_cached;    /* prompt positions found in the prefix cache when admitted first */
    double t_arrival, t_first, t_last;
    int refs; /* the HTTP side and the scheduler; freed at 0 (sv_request_unref) */
} SvRequest;

/* ==== the scheduler (sched.c) ================================================================== */

typedef struct SvConfig {
    int64_t batch_tokens, prefill_chunk, batch_seqs;
    int64_t kv_blocks;
} SvConfig;

/* Histogram buckets (seconds) of /metrics, vLLM's. */
#define SV_NBUCKETS 19
typedef struct SvHist {
    uint64_t count[SV_NBUCKETS + 1]; /* per bucket; the last is +Inf */
    double sum;
    uint64_t n;
} SvHist;

typedef struct SvMetrics {
    int64_t running, waiting;
    int64_t prompt_tokens, generation_tokens, preemptions, requests_done, requests_cancelled, iterations;
    int64_t prefix_hit_blocks;
    /* the engine's calls (RtEngine.calls), iterations it ran as more than one call, the most rows
     * one call held, the most decodes one iteration held */
    int64_t engine_calls, split_iterations, call_rows_max, decodes_max;
    /* seconds inside the engine's steps; and those of the steps that held decodes alone, and their
     * tokens (the engine's decode rate, without the HTTP side) */
    double engine_seconds, decode_seconds;
    int64_t decode_tokens;
    SvHist ttft, itl, e2e;
    double started;
    double tps_t[16]; /* a ring of (time, generation_tokens) samples for tokens per second */
    int64_t tps_n[16];
    int tps_i;
} SvMetrics;

typedef struct SvSched {
    pthread_mutex_t mu;
    pthread_cond_t work;     /* the scheduler waits on it for requests */
    pthread_cond_t progress; /* connections wait on it for tokens */
    RtEngine *engine;
    const SvTokenizer *tok;
    RtKv *kv;
    int64_t kv_block_tokens;
    SvConfig cfg;
    SvRequest **waiting; /* FIFO: waiting[whead, nwaiting) */
    int64_t nwaiting, wcap;
    SvRequest **running; /* in admission order */
    int64_t nrunning;
    int64_t next_id;
    int stop;        /* finish what is queued, then end the thread */
    int draining;    /* no new requests */
    RtStatus failed; /* an engine step failed: every request ends, the server reports it */
    RtError err;
    SvMetrics m;
    float *logits; /* batch_seqs x vocab */
    void *scratch; /* vocab sampling candidates */
    pthread_t thread;
    int thread_started;
} SvSched;

RtStatus sv_sched_open(SvSched *s, RtEngine *e, const SvTokenizer *tok, const SvConfig *cfg, RtError *err);
RtStatus sv_sched_start(SvSched *s, RtError *err); /* starts the scheduler's thread */
/* Finishes the queued and running requests, stops the thread, frees what open allocated (not
 * the requests still referenced by connections). */
void sv_sched_close(SvSched *s);
/* Queues r (its prompt in tokens[0, nprompt)); takes a reference for the scheduler. Under the lock. */
void sv_sched_submit(SvSched *s, SvRequest *r);
void sv_request_unref(SvSched *s, SvRequest *r); /* under the lock */
void sv_hist_add(SvHist *h, const double *bounds, double v);
extern const double sv_ttft_buckets[SV_NBUCKETS], sv_itl_buckets[SV_NBUCKETS];
/* Decodes generated tokens [nprompt, ntok) into *buf (the text of the completion). */
void sv_generated_text(const SvSched *s, const SvRequest *r, char **buf, size_t *len, size_t *cap);

#endif
