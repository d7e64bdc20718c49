/* settings_serve.c - checking serve blocks: the model instantiated, the serving limits (batch, KV
 * cache, sampling, port, tokenizer, chat format) checked and settled into ServeSettings.
 *
 * Pipeline position: AST -> [sema: sema.c drives, settings.c and this file check the blocks] ->
 * graph IR (a serve block's model is compiled with its train block's; docs/serve.md). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "settings_internal.h"

enum { S_MODEL, S_WEIGHTS, S_BATCH, S_KV, S_SAMPLING, S_PORT, S_TOKENIZER, S_CHAT, S_NKEYS };
static const KeySpec serve_keys[S_NKEYS] = {{"model", SK_VALUE},     {"weights", SK_VALUE},  {"batch", SK_BLOCK},
                                            {"kv", SK_BLOCK},        {"sampling", SK_BLOCK}, {"port", SK_VALUE},
                                            {"tokenizer", SK_VALUE}, {"chat", SK_VALUE}};

enum { SB_TOKENS, SB_PREFILL_CHUNK, SB_SEQS, SB_NKEYS };
static const KeySpec serve_batch_keys[SB_NKEYS] = {{"tokens", SK_VALUE}, {"prefill_chunk", SK_VALUE}, {"seqs", SK_VALUE}};

enum { K_BLOCK, K_MEMORY, K_DTYPE, K_NKEYS };
static const KeySpec kv_keys[K_NKEYS] = {{"block", SK_VALUE}, {"memory", SK_VALUE}, {"dtype", SK_VALUE}};

enum { SM_TEMPERATURE, SM_TOP_K, SM_TOP_P, SM_MAX_TOKENS, SM_NKEYS };
static const KeySpec sampling_keys[SM_NKEYS] = {
    {"temperature", SK_VALUE}, {"top_k", SK_VALUE}, {"top_p", SK_VALUE}, {"max_tokens", SK_VALUE}};

/* ---- serve ---- */

void settings_check_serve(Sema *s, Module *m, const Node *t) {
    ServeSettings *ss = arena_alloc(s->ar, sizeof(ServeSettings));
    ss->node = t;
    ss->cfg.name = sema_cstr(s, t->name);
    ss->cfg.at = sema_span_of(t, t->name);
    ss->module = m;
    ss->cfg.tokens = 2048;
    ss->cfg.prefill_chunk = 512;
    ss->cfg.seqs = 128;
    ss->cfg.kv_block = 16;
    ss->cfg.kv_memory = 0.9;
    ss->cfg.kv_dtype = KV_BF16;
    ss->cfg.temperature = 1.0;
    ss->cfg.top_p = 1.0;
    ss->cfg.max_tokens = 256;
    ss->cfg.port = 8000;
    const char *block = arena_printf(s->ar, "serve block '%s'", ss->cfg.name);
    Span name_at = sema_span_of(t, t->name);
    const Node *k[S_NKEYS] = {0};
    unsigned present = 0, sub_present = 0;
    set_gather(s, &t->list, serve_keys, S_NKEYS, block, k, &present);
    set_required(s, present, S_MODEL, serve_keys, name_at, block, "model = MyModel()");
    set_required(s, present, S_WEIGHTS, serve_keys, name_at, block, "weights = \"model.safetensors\"");

    Scope *bs = scope_new(s, m->scope, SC_BLOCK, ss->cfg.name, m);
    Frame f = set_frame(s, bs);
    ss->model = k[S_MODEL] ? set_model(&f, k[S_MODEL]) : value_unknown(s->ar, name_at);
    scope_define(s, bs, str_from("model"), ss->model, ENT_READONLY, k[S_MODEL] ? set_key_span(k[S_MODEL]) : name_at);
    if (ss->model->kind == V_MODEL && ss->model->scope) {
        Entry *fw = scope_find(ss->model->scope, str_from("forward"));
        if (!fw || fw->kind != ENT_FN) {
            const char *mname = ss->model->node ? sema_cstr(s, ss->model->node->name) : "?";
            sema_error(s, set_value_span(k[S_MODEL]), "model '%s' has no 'forward' function, so it cannot be served", mname);
        }
    }
    if (k[S_WEIGHTS]) (void)set_path(&f, k[S_WEIGHTS], "weights", "a safetensors file", &ss->cfg.weights);

    if (k[S_BATCH]) {
        const Node *b[SB_NKEYS] = {0};
        set_gather(s, &k[S_BATCH]->list, serve_batch_keys, SB_NKEYS, "'batch'", b, &sub_present);
        if (b[SB_TOKENS]) (void)set_int(&f, b[SB_TOKENS], "batch.tokens", 1, INT32_MAX, "a positive integer", &ss->cfg.tokens);
        if (b[SB_PREFILL_CHUNK])
            (void)set_int(&f, b[SB_PREFILL_CHUNK], "batch.prefill_chunk", 1, INT32_MAX, "a positive integer",
                          &ss->cfg.prefill_chunk);
        else if (ss->cfg.prefill_chunk > ss->cfg.tokens)
            ss->cfg.prefill_chunk = ss->cfg.tokens; /* the default never exceeds a smaller budget */
        if (b[SB_SEQS]) (void)set_int(&f, b[SB_SEQS], "batch.seqs", 1, INT32_MAX, "a positive integer", &ss->cfg.seqs);
        if (b[SB_PREFILL_CHUNK] && ss->cfg.prefill_chunk > ss->cfg.tokens) {
            if (sema_error(s, set_value_span(b[SB_PREFILL_CHUNK]), "'batch.prefill_chunk' = %lld exceeds 'batch.tokens' = %lld",
                           (long long)ss->cfg.prefill_chunk, (long long)ss->cfg.tokens))
                sema_hint(s, "use prefill_chunk <= %lld", (long long)ss->cfg.tokens);
        }
    }

    if (k[S_KV]) {
        const Node *kv[K_NKEYS] = {0};
        set_gather(s, &k[S_KV]->list, kv_keys, K_NKEYS, "'kv'", kv, &sub_present);
        int64_t blk;
        if (kv[K_BLOCK] && set_int(&f, kv[K_BLOCK], "kv.block", 1, INT32_MAX, "a positive power of two", &blk)) {
            if (blk & (blk - 1)) {
                int64_t lo = 1;
                while (lo * 2 <= blk) lo *= 2;
                if (sema_error(s, set_value_span(kv[K_BLOCK]), "'kv.block' must be a power of two, but it is %lld",
                               (long long)blk))
                    sema_hint(s, "use %lld or %lld", (long long)lo, (long long)(lo * 2));
            } else {
                ss->cfg.kv_block = blk;
            }
        }
        if (kv[K_MEMORY]) (void)set_num(&f, kv[K_MEMORY], "kv.memory", 0, 1, 1, 0, "a fraction in (0, 1]", &ss->cfg.kv_memory);
        static const char *const kv_dtypes[] = {"f32", "bf16", "f16", "fp8"};
        int which;
        if (kv[K_DTYPE] && set_ident(&f, kv[K_DTYPE], "kv.dtype", kv_dtypes, 4, &which)) ss->cfg.kv_dtype = (KvDtype)which;
    }

    if (k[S_SAMPLING]) {
        const Node *sm[SM_NKEYS] = {0};
        set_gather(s, &k[S_SAMPLING]->list, sampling_keys, SM_NKEYS, "'sampling'", sm, &sub_present);
        if (sm[SM_TEMPERATURE])
            (void)set_num(&f, sm[SM_TEMPERATURE], "sampling.temperature", 0, 0, 1e300, 0, "a number >= 0", &ss->cfg.temperature);
        if (sm[SM_TOP_K])
            (void)set_int(&f, sm[SM_TOP_K], "sampling.top_k", 0, INT32_MAX, "a non-negative integer (0 for all)", &ss->cfg.top_k);
        if (sm[SM_TOP_P]) (void)set_num(&f, sm[SM_TOP_P], "sampling.top_p", 0, 1, 1, 0, "a fraction in (0, 1]", &ss->cfg.top_p);
        if (sm[SM_MAX_TOKENS])
            (void)set_int(&f, sm[SM_MAX_TOKENS], "sampling.max_tokens", 1, INT32_MAX, "a positive integer", &ss->cfg.max_tokens);
    }

    if (k[S_PORT]) (void)set_int(&f, k[S_PORT], "port", 1, 65535, "an integer from 1 to 65535", &ss->cfg.port);
    if (k[S_TOKENIZER])
        (void)set_path(&f, k[S_TOKENIZER], "tokenizer", "a tokenizer.json, or a GPT-2 vocab.json beside its merges.txt",
                       &ss->cfg.tokenizer);
    /* the chat templates the server knows (runtime/serve/chat.c; docs/serve.md) */
    static const char *const chat_formats[] = {"chatml", "llama3"};
    int chat;
    if (k[S_CHAT] && set_ident(&f, k[S_CHAT], "chat", chat_formats, 2, &chat)) ss->cfg.chat = chat_formats[chat];

    if (s->out) ptrvec_push(s->ar, &s->out->serves, ss);
}
