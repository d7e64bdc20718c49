/* server.c - `PROG serve`: an OpenAI-compatible HTTP server on libmicrohttpd over the scheduler.
 *
 * Pipeline position: runtime/serve/, the command rt_main dispatches (runtime/cli/train.c). It
 * opens the program (weights, device), the engine (engine.h), the KV pool and the scheduler
 * (sched.c), then serves until SIGTERM or SIGINT. docs/serve.md is the user's description.
 *
 * Threads. libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a
 * connection may block: a completion's handler queues its request and waits on the scheduler's
 * `progress` condition; a stream's content reader waits there for the next token. The scheduler
 * has its own thread. Everything shared is under the scheduler's mutex.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (with a chat template), GET
 * /v1/models, GET /health, GET /metrics (Prometheus text). Errors are OpenAI's JSON
 * ({"error": {"message", "type", "param", "code"}}), 400 for a bad request naming the field.
 *
 * A streamed request whose client goes away is cancelled when libmicrohttpd frees its response
 * (the write fails), and the scheduler frees its blocks at the next iteration. A non-streamed
 * request runs to its end (its connection is not watched while it waits). */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define SV_MAX_BODY (1 << 20) /* bytes of a request body; a larger one is refused (400) */

typedef struct SvServer {
    SvSched sched;
    const RtProgram *prog;
    const RtOptions *opt;
    SvTokenizer *tok;
    const char *model_name;
    const char *chat;  /* chat template or NULL */
    int32_t chat_stop; /* the template's end-of-turn token, or -1 */
    int64_t context;
    struct MHD_Daemon *d;
    int64_t inflight; /* requests between their first byte and their response sent (under sched.mu) */
} SvServer;

/* ---- responses ---------------------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    enum MHD_Result ok = send_text(c, status, "application/json", s, strlen(s));
    free(s);
    return ok;
}

/* OpenAI's error object: {"error": {"message", "type", "param", "code"}}. */
static json_t *error_json(const char *type, const char *param, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", msg, "type", type, "param",
                     param ? json_string(param) : json_null(), "code", json_null());
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    json_t *j = error_json(status == 400   ? "invalid_request_error"
                           : status == 404 ? "not_found_error"
                                           : "server_error",
                           param, fmt, ap);
    va_end(ap);
    return send_json(c, status, j);
}

/* ---- the request body --------------------------------------------------------------------------- */

typedef struct SvBody {
    char *buf;
    size_t len, cap;
    int too_big;
} SvBody;

static void body_free(SvBody *b) {
    if (!b) return;
    free(b->buf);
    free(b);
}

/* ---- parsing a completion request --------------------------------------------------------------- */

typedef struct SvParsed {
    SvRequest *r;
    int stream, include_usage, chat;
    char err_param[64];
    char err[512];
} SvParsed;

static int bad(SvParsed *p, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(SvParsed *p, const char *param, const char *fmt, ...) {
    snprintf(p->err_param, sizeof p->err_param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_number(SvParsed *p, const json_t *o, const char *key, double lo, double hi, double *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(p, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return bad(p, key, "'%s' must be from %g to %g, not %g", key, lo, hi, d);
    *out = d;
    return 0;
}

static int get_int(SvParsed *p, const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return bad(p, key, "'%s' must be an integer", key);
    json_int_t d = json_integer_value(v);
    if (d < lo || d > hi)
        return bad(p, key, "'%s' must be from %lld to %lld, not %lld", key, (long long)lo, (long long)hi, (long long)d);
    *out = d;
    return 0;
}

static int get_bool(SvParsed *p, const json_t *o, const char *key, int *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(p, key, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int push_tokens(SvRequest *r, const int32_t *t, int64_t n) {
    if (r->ntok + n > r->cap) {
        int64_t cap = r->cap ? r->cap : 64;
        while (cap < r->ntok + n) cap *= 2;
        int32_t *q = realloc(r->tokens, (size_t)cap * sizeof *q);
        if (!q) return -1;
        r->tokens = q, r->cap = cap;
    }
    memcpy(r->tokens + r->ntok, t, (size_t)n * sizeof *t);
    r->ntok += n;
    return 0;
}

static int push_text(SvServer *sv, SvParsed *p, const char *text, const char *param) {
    if (!sv->tok) return bad(p, param, "'%s' is text, but this server has no tokenizer: send token ids", param);
    int32_t *ids = NULL;
    int64_t n = 0;
    RtError e;
    if (sv_tokenizer_encode(sv->tok, text, strlen(text), &ids, &n, &e) != RT_OK) return bad(p, param, "'%s': %s", param, e.msg);
    int rc = push_tokens(p->r, ids, n);
    free(ids);
    return rc != 0 ? bad(p, param, "out of memory") : 0;
}

/* The chat template's text for messages (docs/serve.md, "Chat"). */
static int chat_prompt(SvServer *sv, SvParsed *p, const json_t *msgs) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return bad(p, "messages", "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    size_t cap = 256, len = 0;
    char *t = malloc(cap);
    if (!t) return bad(p, "messages", "out of memory");
    t[0] = 0;
    int llama = strcmp(sv->chat, "llama3") == 0;
#define CAT(s)                                                                                                                   \
    do {                                                                                                                         \
        size_t n_ = strlen(s);                                                                                                   \
        while (len + n_ + 1 > cap) cap *= 2;                                                                                     \
        char *q_ = realloc(t, cap);                                                                                              \
        if (!q_) {                                                                                                               \
            free(t);                                                                                                             \
            return bad(p, "messages", "out of memory");                                                                          \
        }                                                                                                                        \
        t = q_;                                                                                                                  \
        memcpy(t + len, s, n_ + 1);                                                                                              \
        len += n_;                                                                                                               \
    } while (0)
    if (llama) CAT("<|begin_of_text|>");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!json_is_object(m) || !role || !content) {
            free(t);
            return bad(p, "messages", "'messages[%zu]' must be an object with string 'role' and 'content'", i);
        }
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            free(t);
            return bad(p, "messages", "'messages[%zu].role' must be system, user or assistant, not '%.40s'", i, role);
        }
        if (llama) {
            CAT("<|start_header_id|>");
            CAT(role);
            CAT("<|end_header_id|>\n\n");
            CAT(content);
            CAT("<|eot_id|>");
        } else {
            CAT("<|im_start|>");
            CAT(role);
            CAT("\n");
            CAT(content);
            CAT("<|im_end|>\n");
        }
    }
    CAT(llama ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n");
#undef CAT
    int rc = push_text(sv, p, t, "messages");
    free(t);
    return rc;
}

static int parse_request(SvServer *sv, SvParsed *p, const char *body, size_t n, int chat) {
    const RtOptions *o = sv->opt;
    json_error_t je;
    json_t *j = json_loadb(body, n, JSON_REJECT_DUPLICATES, &je);
    if (!j) return bad(p, NULL, "the body is not valid JSON: %s (at byte %d)", je.text, je.position);
    int rc = -1;
    SvRequest *r = calloc(1, sizeof *r);
    p->r = r;
    if (!r) {
        bad(p, NULL, "out of memory");
        goto done;
    }
    if (!json_is_object(j)) {
        bad(p, NULL, "the body must be a JSON object");
        goto done;
    }
    r->max_tokens = o->max_tokens, r->temperature = o->temperature, r->top_k = o->top_k, r->top_p = o->top_p;
    const json_t *model = json_object_get(j, "model");
    if (model && !json_is_string(model) && !json_is_null(model)) {
        bad(p, "model", "'model' must be a string");
        goto done;
    }
    if (chat) {
        if (chat_prompt(sv, p, json_object_get(j, "messages")) != 0) goto done;
    } else {
        const json_t *pr = json_object_get(j, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
            pr = json_array_get(pr, 0); /* ["text"]: one prompt */
        if (json_is_string(pr)) {
            if (push_text(sv, p, json_string_value(pr), "prompt") != 0) goto done;
        } else if (json_is_array(pr) && json_array_size(pr) > 0) {
            for (size_t i = 0; i < json_array_size(pr); i++) {
                const json_t *t = json_array_get(pr, i);
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= sv->prog->train.vocab) {
                    bad(p, "prompt", "'prompt[%zu]' must be a token id from 0 to %lld", i, (long long)sv->prog->train.vocab - 1);
                    goto done;
                }
                int32_t id = (int32_t)json_integer_value(t);
                if (push_tokens(r, &id, 1) != 0) {
                    bad(p, "prompt", "out of memory");
                    goto done;
                }
            }
        } else {
            bad(p, "prompt", "'prompt' must be a string or a non-empty array of token ids");
            goto done;
        }
    }
    if (r->ntok == 0) {
        bad(p, chat ? "messages" : "prompt", "the prompt is empty");
        goto done;
    }
    r->nprompt = r->ntok;
    if (r->nprompt >= sv->context) {
        bad(p, chat ? "messages" : "prompt", "This model's maximum context length is %lld tokens, the prompt has %lld%s",
            (long long)sv->context, (long long)r->nprompt,
            r->nprompt == sv->context ? ", which leaves no room for a generated token" : "");
        goto done;
    }
    int64_t n1 = 1, seed = -1, topk = r->top_k;
    int echo = 0;
    if (get_int(p, j, "max_tokens", 1, INT32_MAX, &r->max_tokens) ||
        get_int(p, j, "max_completion_tokens", 1, INT32_MAX, &r->max_tokens) ||
        get_number(p, j, "temperature", 0, 1e6, &r->temperature) || get_number(p, j, "top_p", 1e-9, 1, &r->top_p) ||
        get_int(p, j, "top_k", -1, INT32_MAX, &topk) || get_int(p, j, "n", 1, 1, &n1) ||
        get_int(p, j, "seed", INT64_MIN, INT64_MAX, &seed) || get_bool(p, j, "stream", &p->stream) ||
        get_bool(p, j, "echo", &echo))
        goto done;
    if (echo) {
        bad(p, "echo", "'echo' is not supported");
        goto done;
    }
    /* logprobs: 0 gives each generated token's own log-probability (OpenAI's `logprobs` object);
     * the alternatives (1 to 5) are not done */
    const json_t *lpj = json_object_get(j, "logprobs");
    if (chat && json_is_true(lpj)) {
        bad(p, "logprobs", "'logprobs' is not supported for chat completions (it is for /v1/completions)");
        goto done;
    }
    if (!chat && lpj && !json_is_null(lpj)) {
        int64_t nlp = 0;
        if (get_int(p, j, "logprobs", 0, 5, &nlp)) goto done;
        if (nlp > 0) {
            bad(p, "logprobs", "'logprobs' above 0 (the most likely alternatives) is not supported; 0 gives each token's own");
            goto done;
        }
        r->want_logprobs = 1;
    }
    r->top_k = topk < 0 ? 0 : topk;
    /* without a seed, each request draws from its own stream of the server's --seed */
    /* without a seed, the scheduler gives each request its own stream of the server's --seed */
    r->seed_given = json_object_get(j, "seed") && !json_is_null(json_object_get(j, "seed"));
    r->seed = r->seed_given ? (uint64_t)seed : o->seed;
    const json_t *so = json_object_get(j, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            bad(p, "stream_options", "'stream_options' must be an object");
            goto done;
        }
        if (get_bool(p, so, "include_usage", &p->include_usage)) goto done;
    }
    const json_t *stop = json_object_get(j, "stop");
    if (stop && !json_is_null(stop)) {
        size_t ns = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
        if (!json_is_string(stop) && !json_is_array(stop)) {
            bad(p, "stop", "'stop' must be a string or an array of strings");
            goto done;
        }
        if (ns > 0 && !sv->tok) {
            bad(p, "stop", "'stop' strings need a tokenizer; this server has none (use 'stop_token_ids')");
            goto done;
        }
        r->stop_strs = calloc(ns ? ns : 1, sizeof *r->stop_strs);
        for (size_t i = 0; r->stop_strs && i < ns; i++) {
            const json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(s) || json_string_length(s) == 0) {
                bad(p, "stop", "'stop' must be a string or an array of non-empty strings");
                goto done;
            }
            r->stop_strs[r->nstop_strs++] = strdup(json_string_value(s));
        }
    }
    const json_t *sid = json_object_get(j, "stop_token_ids");
    if (sid && !json_is_null(sid)) {
        if (!json_is_array(sid)) {
            bad(p, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
            goto done;
        }
        r->stop_ids = calloc(json_array_size(sid) + 1, sizeof *r->stop_ids);
        for (size_t i = 0; r->stop_ids && i < json_array_size(sid); i++) {
            const json_t *t = json_array_get(sid, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= sv->prog->train.vocab) {
                bad(p, "stop_token_ids", "'stop_token_ids[%zu]' must be a token id from 0 to %lld", i,
                    (long long)sv->prog->train.vocab - 1);
                goto done;
            }
            r->stop_ids[r->nstop_ids++] = (int32_t)json_integer_value(t);
        }
    }
    if (chat && sv->chat_stop >= 0) { /* the template's end of turn ends the reply */
        int32_t *q = realloc(r->stop_ids, (size_t)(r->nstop_ids + 1) * sizeof *q);
        if (q) r->stop_ids = q, r->stop_ids[r->nstop_ids++] = sv->chat_stop;
    }
    rc = 0;
done:
    json_decref(j);
    return rc;
}

/* ---- the completion's JSON ---------------------------------------------------------------------- */

/* s[0, n) with every piece that is not a whole UTF-8 character replaced by U+FFFD (as `tokenizers`
 * decodes, lossily): JSON strings must be valid UTF-8. */
static char *utf8_lossy(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1);
    size_t k = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = need > 0 && i + need <= n;
        for (size_t j = 1; ok && j < need; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (ok && need > 1) { /* overlong forms and surrogates are not whole characters either */
            uint32_t v = need == 2 ? c & 0x1Fu : need == 3 ? c & 0x0Fu : c & 0x07u;
            for (size_t j = 1; j < need; j++) v = v << 6 | ((unsigned char)s[i + j] & 0x3Fu);
            ok = (need == 2 && v >= 0x80) || (need == 3 && v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) ||
                 (need == 4 && v >= 0x10000 && v <= 0x10FFFF);
        }
        if (ok) {
            memcpy(o + k, s + i, need);
            k += need, i += need;
        } else { /* one U+FFFD for a lead byte and the continuation bytes after it, as Rust's from_utf8_lossy */
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3, i++;
            for (size_t j = 1; need > 1 && j < need && i < n && ((unsigned char)s[i] & 0xC0) == 0x80; j++) i++;
        }
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

/* The generated text: decoded with the tokenizer (cut at a stop string), else the ids as text. */
static char *completion_text(SvServer *sv, const SvRequest *r, int64_t from, int64_t to, size_t *len) {
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    if (sv->tok) {
        for (int64_t i = from; i < to; i++) sv_tokenizer_piece(sv->tok, r->tokens[i], &buf, len, &cap);
    } else {
        for (int64_t i = from; i < to; i++) {
            char num[24];
            int k = snprintf(num, sizeof num, "%s%d", i > r->nprompt ? " " : "", (int)r->tokens[i]);
            if (*len + (size_t)k + 1 > cap) {
                cap = (*len + (size_t)k + 1) * 2;
                char *q = realloc(buf, cap);
                if (!q) break;
                buf = q;
            }
            memcpy(buf + *len, num, (size_t)k);
            *len += (size_t)k;
        }
    }
    if (!buf) buf = calloc(1, 1);
    else buf[*len < cap ? *len : cap - 1] = 0;
    return buf;
}

static json_t *usage_json(const SvRequest *r) {
    int64_t gen = r->ntok - r->nprompt;
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)r->nprompt, "completion_tokens", (json_int_t)gen,
                     "total_tokens", (json_int_t)r->ntok);
}

static json_t *ids_json(const SvRequest *r, int64_t from, int64_t to) {
    json_t *a = json_array();
    for (int64_t i = from; i < to; i++) json_array_append_new(a, json_integer(r->tokens[i]));
    return a;
}

/* OpenAI's completion logprobs for tokens [from, to): their text (the decimal id without a
 * tokenizer), their log-probabilities, no alternatives; null where none was asked. */
static json_t *logprobs_json(SvServer *sv, const SvRequest *r, int64_t from, int64_t to) {
    if (!r->want_logprobs || !r->logprob) return json_null();
    json_t *o = json_object(), *toks = json_array(), *lps = json_array();
    for (int64_t i = from; i < to; i++) {
        char *buf = NULL, num[24];
        size_t len = 0, cap = 0;
        json_t *t = NULL;
        if (sv->tok && sv_tokenizer_piece(sv->tok, r->tokens[i], &buf, &len, &cap) == 0) {
            size_t vl;
            char *valid = utf8_lossy(buf, len, &vl);
            t = valid ? json_stringn(valid, vl) : NULL;
            free(valid);
        }
        free(buf);
        if (!t) {
            snprintf(num, sizeof num, "%d", (int)r->tokens[i]);
            t = json_string(num);
        }
        json_array_append_new(toks, t);
        json_array_append_new(lps, json_real(r->logprob[i]));
    }
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", json_null());
    return o;
}

static json_t *choice_json(SvServer *sv, const SvRequest *r, int chat, int delta, const char *text, size_t len, int64_t from,
                           int64_t to, const char *finish) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    size_t vl;
    char *valid = utf8_lossy(text, len, &vl);
    json_t *t = valid ? json_stringn(valid, vl) : NULL;
    free(valid);
    if (!t) t = json_string("");
    if (chat) {
        json_t *m = json_object();
        if (!delta || from == r->nprompt) json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", t);
        json_object_set_new(c, delta ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", t);
        json_object_set_new(c, "logprobs", logprobs_json(sv, r, from, to));
    }
    json_object_set_new(c, "token_ids", ids_json(r, from, to));
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    (void)sv;
    return c;
}

static json_t *envelope(SvServer *sv, const SvRequest *r, int chat, int chunk) {
    char id[48];
    snprintf(id, sizeof id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)r->id);
    return json_pack("{s:s,s:s,s:I,s:s}", "id", id, "object",
                     chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion", "created",
                     (json_int_t)time(NULL), "model", sv->model_name);
}

/* ---- streaming ---------------------------------------------------------------------------------- */

typedef struct SvStream {
    SvServer *sv;
    SvRequest *r;
    int chat, include_usage;
    int64_t sent_tok;  /* tokens sent */
    size_t sent_bytes; /* text bytes sent (with a tokenizer) */
    char *pend;        /* the bytes of the next events, pend[off, len) left */
    size_t off, len;
    int finished; /* the last events are in pend */
} SvStream;

static int append(SvStream *st, const char *s, size_t n) {
    char *q = realloc(st->pend, st->len + n + 1);
    if (!q) return -1;
    st->pend = q;
    memcpy(st->pend + st->len, s, n);
    st->len += n;
    return 0;
}

static int append_event(SvStream *st, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return -1;
    int rc = append(st, "data: ", 6) || append(st, s, strlen(s)) || append(st, "\n\n", 2);
    free(s);
    return rc;
}

/* The length of the longest prefix of s[0, n) that ends on a whole UTF-8 character. */
static size_t utf8_whole(const char *s, size_t n) {
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return (size_t)back + 1 >= need ? n : i - 1;
}

/* Builds the events for tokens generated since the last call (under the lock): one event a token,
 * as OpenAI's server sends them; with a tokenizer, an event's text is what that token completes
 * (a character split across tokens comes whole with its last token; a stop string and what
 * follows it are never sent). */
static void stream_fill(SvStream *st) {
    SvServer *sv = st->sv;
    SvRequest *r = st->r;
    int done = r->state == SV_DONE;
    size_t len = 0;
    char *text = NULL;
    if (sv->tok) {
        text = completion_text(sv, r, r->nprompt, r->ntok, &len);
        if (r->text_end >= 0 && (size_t)r->text_end < len) len = (size_t)r->text_end;
    }
    size_t acc = 0; /* text bytes through the token being sent */
    if (sv->tok)
        for (int64_t i = r->nprompt; i < r->nprompt + st->sent_tok; i++) {
            char *one = NULL;
            size_t l1 = 0, c1 = 0;
            sv_tokenizer_piece(sv->tok, r->tokens[i], &one, &l1, &c1);
            acc += l1;
            free(one);
        }
    for (int64_t from = r->nprompt + st->sent_tok; from < r->ntok; from++) {
        int last = done && from == r->ntok - 1;
        const char *piece = NULL;
        size_t plen = 0;
        char *ids_text = NULL;
        if (sv->tok) {
            char *one = NULL;
            size_t l1 = 0, c1 = 0;
            sv_tokenizer_piece(sv->tok, r->tokens[from], &one, &l1, &c1);
            free(one);
            acc += l1;
            size_t upto = acc < len ? acc : len;
            if (!last) upto = utf8_whole(text, upto);
            if (upto < st->sent_bytes) upto = st->sent_bytes;
            piece = text + st->sent_bytes, plen = upto - st->sent_bytes;
            st->sent_bytes = upto;
        } else { /* the id as text, as in a whole completion */
            ids_text = completion_text(sv, r, from, from + 1, &plen);
            piece = ids_text;
        }
        json_t *e = envelope(sv, r, st->chat, 1);
        json_t *ch = json_array();
        json_array_append_new(ch, choice_json(sv, r, st->chat, 1, piece, plen, from, from + 1, last ? r->finish_reason : NULL));
        json_object_set_new(e, "choices", ch);
        if (st->include_usage) json_object_set_new(e, "usage", json_null());
        append_event(st, e);
        free(ids_text);
        st->sent_tok++;
    }
    free(text);
    if (done) {
        if (r->ntok == r->nprompt || strcmp(r->finish_reason, "cancelled") == 0) { /* no token carried the reason */
            json_t *e = envelope(sv, r, st->chat, 1);
            json_t *ch = json_array();
            json_array_append_new(ch, choice_json(sv, r, st->chat, 1, "", 0, r->ntok, r->ntok, r->finish_reason));
            json_object_set_new(e, "choices", ch);
            append_event(st, e);
        }
        if (st->include_usage) {
            json_t *e = envelope(sv, r, st->chat, 1);
            json_object_set_new(e, "choices", json_array());
            json_object_set_new(e, "usage", usage_json(r));
            append_event(st, e);
        }
        append(st, "data: [DONE]\n\n", 14);
        st->finished = 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    SvStream *st = cls;
    SvSched *s = &st->sv->sched;
    if (st->off == st->len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        st->off = st->len = 0;
        pthread_mutex_lock(&s->mu);
        while (st->r->state != SV_DONE && st->r->ntok == st->r->nprompt + st->sent_tok) pthread_cond_wait(&s->progress, &s->mu);
        stream_fill(st);
        pthread_mutex_unlock(&s->mu);
        if (st->off == st->len) return st->finished ? MHD_CONTENT_READER_END_OF_STREAM : 0;
    }
    size_t n = st->len - st->off < max ? st->len - st->off : max;
    memcpy(buf, st->pend + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

/* libmicrohttpd is done with the response: the stream ended, or the client went away. */
static void stream_free(void *cls) {
    SvStream *st = cls;
    SvSched *s = &st->sv->sched;
    pthread_mutex_lock(&s->mu);
    if (st->r->state != SV_DONE) {
        st->r->cancelled = 1;
        pthread_cond_signal(&s->work);
    }
    sv_request_unref(s, st->r);
    pthread_mutex_unlock(&s->mu);
    free(st->pend);
    free(st);
}

/* ---- the endpoints ------------------------------------------------------------------------------ */

static enum MHD_Result completion(SvServer *sv, struct MHD_Connection *c, const SvBody *b, int chat) {
    SvSched *s = &sv->sched;
    if (chat && !sv->chat)
        return send_error(c, 404, NULL, "this server has no chat template: the serve block names no 'chat' format");
    if (b->too_big) return send_error(c, 400, NULL, "the request body is larger than %d bytes", SV_MAX_BODY);
    SvParsed p = {0};
    int rc = parse_request(sv, &p, b->buf ? b->buf : "", b->len, chat);
    if (rc != 0) {
        if (p.r) {
            p.r->refs = 1;
            pthread_mutex_lock(&s->mu);
            sv_request_unref(s, p.r);
            pthread_mutex_unlock(&s->mu);
        }
        return send_error(c, 400, p.err_param[0] ? p.err_param : NULL, "%s", p.err);
    }
    SvRequest *r = p.r;
    r->refs = 1; /* this connection's */
    r->t_arrival = rt_now();
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->failed) {
        sv_request_unref(s, r);
        pthread_mutex_unlock(&s->mu);
        return send_error(c, 503, NULL, "the server is shutting down");
    }
    sv_sched_submit(s, r);
    if (p.stream) {
        pthread_mutex_unlock(&s->mu);
        SvStream *st = calloc(1, sizeof *st);
        if (!st) {
            pthread_mutex_lock(&s->mu);
            r->cancelled = 1;
            sv_request_unref(s, r);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        st->sv = sv, st->r = r, st->chat = chat, st->include_usage = p.include_usage;
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    while (r->state != SV_DONE) pthread_cond_wait(&s->progress, &s->mu);
    size_t len;
    char *text = completion_text(sv, r, r->nprompt, r->ntok, &len);
    if (r->text_end >= 0 && (size_t)r->text_end < len) len = (size_t)r->text_end;
    json_t *e = envelope(sv, r, chat, 0);
    json_t *ch = json_array();
    json_array_append_new(ch, choice_json(sv, r, chat, 0, text, len, r->nprompt, r->ntok, r->finish_reason));
    json_object_set_new(e, "choices", ch);
    json_object_set_new(e, "usage", usage_json(r));
    int cancelled = strcmp(r->finish_reason, "cancelled") == 0;
    sv_request_unref(s, r);
    pthread_mutex_unlock(&s->mu);
    free(text);
    if (cancelled) {
        json_decref(e);
        return send_error(c, 503, NULL, "the request was cancelled: the server is shutting down or failed");
    }
    return send_json(c, 200, e);
}

static void hist_text(FILE *f, const char *name, const char *help, const SvHist *h, const double *bounds) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t acc = 0;
    for (int i = 0; i < SV_NBUCKETS; i++) {
        acc += h->count[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)acc);
    }
    acc += h->count[SV_NBUCKETS];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)acc, name, h->sum, name,
            (unsigned long long)h->n);
}

static enum MHD_Result metrics(SvServer *sv, struct MHD_Connection *c) {
    SvSched *s = &sv->sched;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->mu);
    SvMetrics m = s->m;
    int64_t used = rt_kv_used_blocks(s->kv), cached = rt_kv_cached_blocks(s->kv), total = s->cfg.kv_blocks;
    pthread_mutex_unlock(&s->mu);
    double now = rt_now(), tps = 0;
    int oldest = m.tps_i; /* the ring's oldest sample within 10 s */
    for (int k = 0; k < 16; k++) {
        int i = (m.tps_i + k) % 16;
        if (m.tps_t[i] > 0 && now - m.tps_t[i] <= 10.0) {
            oldest = i;
            break;
        }
    }
    if (m.tps_t[oldest] > 0 && now - m.tps_t[oldest] > 0.05)
        tps = (double)(m.generation_tokens - m.tps_n[oldest]) / (now - m.tps_t[oldest]);
#define GAUGE(name, help, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " %lld\n", (long long)(v))
#define COUNTER(name, help, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %lld\n", (long long)(v))
    GAUGE("mbt_serve_requests_running", "Requests in the running batch.", m.running);
    GAUGE("mbt_serve_requests_waiting", "Requests waiting to be admitted (preempted ones included).", m.waiting);
    GAUGE("mbt_serve_kv_blocks_used", "KV blocks referenced by sequences.", used);
    GAUGE("mbt_serve_kv_blocks_cached", "Free KV blocks that still hold a shared prefix.", cached);
    GAUGE("mbt_serve_kv_blocks_total", "KV blocks in the pool.", total);
    COUNTER("mbt_serve_preemptions_total", "Sequences preempted for want of KV blocks.", m.preemptions);
    COUNTER("mbt_serve_prompt_tokens_total", "Prompt tokens received.", m.prompt_tokens);
    COUNTER("mbt_serve_generation_tokens_total", "Tokens generated.", m.generation_tokens);
    COUNTER("mbt_serve_prefix_cache_hit_blocks_total", "Prompt blocks found in the prefix cache.", m.prefix_hit_blocks);
    COUNTER("mbt_serve_requests_finished_total", "Requests that ended with a stop or length.", m.requests_done);
    COUNTER("mbt_serve_requests_cancelled_total", "Requests cancelled (the client went away, or shutdown).",
            m.requests_cancelled);
    COUNTER("mbt_serve_iterations_total", "Engine steps.", m.iterations);
    COUNTER("mbt_serve_engine_calls_total",
            "Calls of the model's forward (forward_chunk; forward_logits a sequence without the cache).", m.engine_calls);
    COUNTER("mbt_serve_split_iterations_total", "Engine steps that took more than one call of the model's forward.",
            m.split_iterations);
    GAUGE("mbt_serve_engine_call_rows", "New tokens one call of forward_chunk takes at most (0: no KV cache).",
          s->engine->call_rows);
    GAUGE("mbt_serve_engine_call_rows_max", "The most new tokens one call has held.", m.call_rows_max);
    fprintf(f,
            "# HELP mbt_serve_engine_seconds_total Seconds inside the engine's steps.\n"
            "# TYPE mbt_serve_engine_seconds_total counter\nmbt_serve_engine_seconds_total %.9g\n"
            "# HELP mbt_serve_decode_step_seconds_total Seconds inside the steps that held decodes alone.\n"
            "# TYPE mbt_serve_decode_step_seconds_total counter\nmbt_serve_decode_step_seconds_total %.9g\n",
            m.engine_seconds, m.decode_seconds);
    COUNTER("mbt_serve_decode_step_tokens_total", "Tokens of the steps that held decodes alone.", m.decode_tokens);
    GAUGE("mbt_serve_decode_batch_max", "The most decodes (one new token of a sequence past its prompt) one step has held.",
          m.decodes_max);
    fprintf(f,
            "# HELP mbt_serve_generation_tokens_per_second Tokens generated per second over the last 10 s.\n"
            "# TYPE mbt_serve_generation_tokens_per_second gauge\nmbt_serve_generation_tokens_per_second %.6g\n",
            tps);
    hist_text(f, "mbt_serve_time_to_first_token_seconds", "Time from arrival to the first generated token.", &m.ttft,
              sv_ttft_buckets);
    hist_text(f, "mbt_serve_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", &m.itl,
              sv_itl_buckets);
    hist_text(f, "mbt_serve_request_latency_seconds", "Time from arrival to the last token of a finished request.", &m.e2e,
              sv_itl_buckets);
#undef GAUGE
#undef COUNTER
    fclose(f);
    enum MHD_Result ok = send_text(c, 200, "text/plain; version=0.0.4", buf, len);
    free(buf);
    return ok;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                               const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    SvServer *sv = cls;
    SvBody *b = *con_cls;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return MHD_NO;
        *con_cls = b;
        pthread_mutex_lock(&sv->sched.mu);
        sv->inflight++;
        pthread_mutex_unlock(&sv->sched.mu);
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!b->too_big && b->len + *upload_size > SV_MAX_BODY) {
            b->too_big = 1;
            free(b->buf);
            b->buf = NULL, b->len = b->cap = 0;
        }
        if (!b->too_big) {
            if (b->len + *upload_size + 1 > b->cap) {
                size_t cap = (b->len + *upload_size + 1) * 2;
                char *q = realloc(b->buf, cap);
                if (!q) return MHD_NO;
                b->buf = q, b->cap = cap;
            }
            memcpy(b->buf + b->len, upload, *upload_size);
            b->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
        if (!post) return send_error(c, 405, NULL, "%s takes POST", url);
        return completion(sv, c, b, url[4] == 'c' && url[5] == 'h');
    }
    if (strcmp(url, "/health") == 0 && get) {
        pthread_mutex_lock(&sv->sched.mu);
        int ok = !sv->sched.draining && !sv->sched.failed;
        pthread_mutex_unlock(&sv->sched.mu);
        return ok ? send_text(c, 200, "application/json", "{\"status\":\"ok\"}", 15)
                  : send_text(c, 503, "application/json", "{\"status\":\"draining\"}", 21);
    }
    if (strcmp(url, "/v1/models") == 0 && get) {
        json_t *m =
            json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:I}]}", "object", "list", "data", "id", sv->model_name, "object", "model",
                      "created", (json_int_t)time(NULL), "owned_by", "mbt", "max_model_len", (json_int_t)sv->context);
        return send_json(c, 200, m);
    }
    if (strcmp(url, "/metrics") == 0 && get) return metrics(sv, c);
    return send_error(c, 404, NULL,
                      "no endpoint %s %s (the endpoints: POST /v1/completions, POST /v1/chat/completions, GET "
                      "/v1/models, GET /health, GET /metrics)",
                      method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    SvServer *sv = cls;
    if (!*con_cls) return;
    body_free(*con_cls);
    *con_cls = NULL;
    pthread_mutex_lock(&sv->sched.mu);
    sv->inflight--;
    pthread_cond_broadcast(&sv->sched.progress);
    pthread_mutex_unlock(&sv->sched.mu);
}

/* ---- the command -------------------------------------------------------------------------------- */

static volatile sig_atomic_t sv_signal;
static void on_signal(int sig) { sv_signal = sig; }

/* Blocks for kv.memory of the budget: on the GPU the device's free memory once the weights, the
 * arena and the engine's buffers are allocated (cuMemGetInfo); on the CPU MBT_SERVE_HOST_MEMORY
 * bytes, else the machine's physical memory. Without a cache (the recompute engine), enough for
 * batch.seqs full contexts. *budget_out: the budget (-1 when none was read). */
static RtStatus pool_blocks(const RtProgram *p, const RtEngine *e, const RtOptions *o, int64_t *out, double *budget_out,
                            RtError *err) {
    *budget_out = -1;
    int64_t per_ctx = (e->context + e->block - 1) / e->block;
    if (o->kv_blocks > 0) *out = o->kv_blocks;
    else if (e->kv_bytes_per_token == 0) *out = per_ctx * o->batch_seqs;
    else {
        double budget = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        if (e->x->gpu) {
            int64_t free_bytes = 0, total = 0;
            RtStatus st = rt_gpu_mem_info(e->x->gpu, &free_bytes, &total, err);
            if (st != RT_OK) return st;
            budget = (double)free_bytes;
        } else {
            const char *env = getenv("MBT_SERVE_HOST_MEMORY");
            if (env && *env) budget = strtod(env, NULL);
        }
        *budget_out = budget;
        *out = (int64_t)(budget * p->generate.kv_memory / ((double)e->block * (double)e->kv_bytes_per_token));
    }
    return RT_OK;
}

int rt_cmd_serve(const RtProgram *p, const RtOptions *o) {
    RtError e;
    rt_error_clear(&e);
    RtExec x = {0};
    RtEngine eng = {0};
    SvServer *sv = calloc(1, sizeof *sv);
    int code = 1, sched_open = 0;
    RtStatus st = RT_OK;
    const char *weights = o->weights ? o->weights : p->generate.weights;
    if (!sv) st = rt_fail_errno(&e, ENOMEM, "cannot allocate the server");
    else if (!p->forward_logits)
        st = rt_fail(&e, RT_ERR_ARG, "this program cannot serve: it was compiled without a logits forward (mbtc warned why)");
    else if (!weights) st = rt_fail(&e, RT_ERR_ARG, "serve needs --weights F.safetensors (the program names no weights file)");
    else if (o->prefill_chunk > o->batch_tokens)
        st = rt_fail(&e, RT_ERR_ARG, "--prefill-chunk %lld exceeds --batch-tokens %lld", (long long)o->prefill_chunk,
                     (long long)o->batch_tokens);
    if (st != RT_OK) goto done;
    sv->prog = p, sv->opt = o, sv->chat_stop = -1;
    sv->model_name = p->generate.name ? p->generate.name : p->train.name;
    sv->chat = p->generate.chat;
    if (o->tokenizer) {
        st = sv_tokenizer_load(&sv->tok, o->tokenizer, &e);
        if (st == RT_OK && sv_tokenizer_vocab(sv->tok) > p->train.vocab)
            st = rt_fail(&e, RT_ERR_ARG, "the tokenizer '%s' has ids up to %lld, beyond the model's vocabulary of %lld",
                         o->tokenizer, (long long)sv_tokenizer_vocab(sv->tok) - 1, (long long)p->train.vocab);
        if (st != RT_OK) goto done;
        if (sv->chat) sv->chat_stop = sv_tokenizer_find(sv->tok, strcmp(sv->chat, "llama3") == 0 ? "<|eot_id|>" : "<|im_end|>");
    }
    if (sv->chat && !sv->tok) {
        st = rt_fail(&e, RT_ERR_ARG,
                     "the serve block names the chat format '%s', which needs a tokenizer (--tokenizer or the "
                     "serve block's tokenizer)",
                     sv->chat);
        goto done;
    }
    st = rt_exec_open(&x, p, o->threads, rt_device_want(o), &e);
    if (st == RT_OK) {
        int64_t unused = 0;
        st = rt_weights_load(p, x.params, weights, &unused, &e);
    }
    if (st == RT_OK) st = rt_exec_push(&x, &e);
    /* the KV cache when the program has one on this device (engine_cached.c: the compiled
     * forward_chunk, with the serve block's kv.block), else the recompute engine (and --no-cache) */
    if (st == RT_OK && !o->no_cache && p->forward_chunk && p->kv.block == p->generate.kv_block)
        st = rt_engine_open_cached(&eng, &x, p->generate.kv_block, &e);
    else if (st == RT_OK) st = rt_engine_open_recompute(&eng, &x, p->generate.kv_block, &e);
    if (st != RT_OK) goto done;
    sv->context = eng.context;
    SvConfig cfg = {o->batch_tokens, o->prefill_chunk, o->batch_seqs, 0};
    double budget = -1; /* none read: --kv-blocks, or no cache */
    st = pool_blocks(p, &eng, o, &cfg.kv_blocks, &budget, &e);
    if (st != RT_OK) goto done;
    int64_t per_ctx = (eng.context + eng.block - 1) / eng.block;
    if (cfg.kv_blocks < per_ctx) {
        st = rt_fail(&e, RT_ERR_ARG,
                     "the KV pool of %lld blocks of %lld tokens is smaller than one full context (%lld tokens, %lld blocks)%s: "
                     "give more memory (kv.memory, --kv-blocks)",
                     (long long)cfg.kv_blocks, (long long)eng.block, (long long)eng.context, (long long)per_ctx,
                     budget >= 0 && x.gpu ? " (kv.memory of the GPU's free memory)" : "");
        goto done;
    }
    st = rt_engine_pool(&eng, cfg.kv_blocks, &e);
    if (st == RT_OK) st = sv_sched_open(&sv->sched, &eng, sv->tok, &cfg, &e);
    sched_open = 1;
    if (st == RT_OK) st = sv_sched_start(&sv->sched, &e);
    if (st != RT_OK) goto done;

    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        st = rt_fail(&e, RT_ERR_ARG, "--host needs an IPv4 address (like 127.0.0.1 or 0.0.0.0), not '%s'", o->host);
        goto done;
    }
    signal(SIGPIPE, SIG_IGN);
    sv->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG,
                             (uint16_t)o->port, NULL, NULL, handler, sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                             MHD_OPTION_NOTIFY_COMPLETED, completed, sv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000, MHD_OPTION_END);
    if (!sv->d) {
        st = rt_fail(&e, RT_ERR_IO, "cannot listen on %s:%lld (in use, or not an address of this machine)", o->host,
                     (long long)o->port);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    unsigned port = di ? di->port : (unsigned)o->port;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("serve: model '%s', context %lld, engine %s on %s, KV pool %lld blocks of %lld tokens, batch %lld tokens / %lld "
           "sequences, prefill chunk %lld%s%s\n",
           sv->model_name, (long long)eng.context, eng.ops->name, rt_exec_device(&x), (long long)cfg.kv_blocks,
           (long long)eng.block, (long long)cfg.batch_tokens, (long long)cfg.batch_seqs, (long long)cfg.prefill_chunk,
           sv->tok ? ", tokenizer " : "", sv->tok ? o->tokenizer : "");
    if (budget >= 0)
        printf("serve: the KV pool is kv.memory (%g) of %.0f bytes (%s) at %lld bytes a block\n", p->generate.kv_memory, budget,
               x.gpu ? "the GPU's free memory" : "the host's memory", (long long)(eng.block * eng.kv_bytes_per_token));
    if (eng.kv_bytes_per_token == 0)
        printf("serve: the %s engine keeps no KV cache: the pool's blocks are bookkeeping only, and kv.memory (%g) and "
               "kv.dtype (%s) size nothing (docs/serve.md)\n",
               eng.ops->name, p->generate.kv_memory, p->generate.kv_dtype ? p->generate.kv_dtype : "?");
    printf("serve: listening on http://%s:%u\n", o->host, port);
    fflush(stdout);
    while (!sv_signal) {
        pthread_mutex_lock(&sv->sched.mu);
        int failed = sv->sched.failed != RT_OK;
        pthread_mutex_unlock(&sv->sched.mu);
        if (failed) break;
        usleep(50 * 1000); /* a signal ends the sleep early */
    }
    /* Stop accepting connections; the requests already on open connections (being read, queued or
     * running) are served to their end - at most 30 s are given to them before new requests on
     * kept-alive connections are refused (503) - then the scheduler finishes what it holds. */
    MHD_socket ls = MHD_quiesce_daemon(sv->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    pthread_mutex_lock(&sv->sched.mu);
    struct timespec grace;
    clock_gettime(CLOCK_REALTIME, &grace);
    grace.tv_sec += 30;
    while (sv->inflight > 0 && !sv->sched.failed && pthread_cond_timedwait(&sv->sched.progress, &sv->sched.mu, &grace) == 0) {}
    sv->sched.draining = 1;
    int64_t nrun = sv->sched.m.running, nwait = sv->sched.m.waiting;
    pthread_mutex_unlock(&sv->sched.mu);
    fprintf(stderr, "serve: %s: finishing %lld running and %lld waiting requests\n", sv_signal ? strsignal(sv_signal) : "failed",
            (long long)nrun, (long long)nwait);
    sv_sched_close(&sv->sched); /* joins the scheduler after the queue is empty */
    sched_open = 0;
    /* the last responses go out before the daemon closes the connections (at most 10 s more: a
     * client that stopped reading does not hold the exit) */
    pthread_mutex_lock(&sv->sched.mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (sv->inflight > 0 && pthread_cond_timedwait(&sv->sched.progress, &sv->sched.mu, &until) == 0) {}
    pthread_mutex_unlock(&sv->sched.mu);
    MHD_stop_daemon(sv->d);
    sv->d = NULL;
    if (sv->sched.failed != RT_OK) {
        e = sv->sched.err;
        st = sv->sched.failed;
        goto done;
    }
    code = 0;
done:
    if (code != 0) {
        fflush(stdout);
        fprintf(stderr, "%s: %s\n", o->prog, e.msg);
    }
    if (sv && sv->d) MHD_stop_daemon(sv->d);
    if (sv && sched_open) sv_sched_close(&sv->sched);
    rt_engine_close(&eng);
    rt_exec_close(&x);
    if (sv) sv_tokenizer_free(sv->tok);
    free(sv);
    return code;
}
