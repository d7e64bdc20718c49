/* schedules.c - the fused schedules of a train block (plan.h, PlanSchedules): the step and update
 * graphs fused, and generation's forward at batch 1 built and fused for its logits alone. The
 * memory plan is made of them (plan_memory.c), and the host code and the CUDA program lower them.
 *
 * The logits are the model's output: the train block's `model(data.x)` built as a graph of its own
 * with data.x of one row (sema_build_train builds it in the same walk as the step), so the loss
 * and data.y are not part of it. It must be f32[1, T, vocab], vocab the
 * last dimension of the logits the loss's cross_entropy reads. Dropout is off (p = 0): generation
 * runs the model for inference. A causal model's row len - 1 does not depend on the positions
 * after it; a program whose model is visibly not causal (attention with causal = false) gets no
 * logits schedule. */
#include <inttypes.h>
#include <string.h>

#include "diag.h"
#include "plan.h"
#include "sema.h"

/* The last dimension of the value the step's cross_entropy reads; 0 without one. */
static int64_t plan_find_vocab(const Graph *g) {
    for (int i = 0; i < g->n; i++) {
        const GNode *n = graph_node(g, i);
        if (n->op == G_CROSS_ENTROPY) {
            const GNode *l = graph_node(g, n->in[0]);
            return l->shape[l->rank - 1];
        }
    }
    return 0;
}

/* Whether g's output node (-1: none) is logits generation can use: NULL when it is, else why not,
 * with *at where (span_none when nowhere). T = seq, vocab from the step graph (0: no cross_entropy). */
static const char *logits_refusal(const Graph *g, int out, int64_t T, int64_t vocab, Span *at, Arena *ar) {
    *at = span_none();
    for (int i = 0; i < g->n; i++) {
        const GNode *n = graph_node(g, i);
        if (n->op == G_ATTENTION && !n->iattr[0]) { /* a position would see the tokens after it */
            *at = n->src;
            return "its attention is not causal, so a position's logits depend on the tokens after it";
        }
    }
    if (vocab <= 0) return "its loss has no cross_entropy, so the model's output is not known to be logits of the next token";
    if (out < 0) return "the model's forward does not return one tensor";
    const GNode *ln = graph_node(g, out);
    *at = ln->src;
    if (ln->dt == DT_F32 && ln->rank == 3 && ln->shape[0] == 1 && ln->shape[1] == T && ln->shape[2] == vocab) return NULL;
    const char *shape = "";
    for (int d = 0; d < ln->rank; d++) shape = arena_printf(ar, "%s%s%lld", shape, d ? ", " : "", (long long)ln->shape[d]);
    return arena_printf(ar, "the model's forward returns %s[%s] at batch 1, not logits f32[1, %lld, %lld] ([B, T, vocab])",
                        dtype_name(ln->dt), shape, (long long)T, (long long)vocab);
}

/* The graph of the train block's model(data.x) at batch 1, its logits in *node; NULL after errors
 * (reported) or, with out->why_no_logits set, when this program cannot generate. Its parameters
 * must be the step graph's, in the same order (the plan gives both the same parameter slots). */
static Graph *logits_graph(const TrainBuild *tb, PlanSchedules *out, Arena *ar) {
    const Graph *step = tb->step;
    const TrainConfig *ts = tb->config;
    Graph *g = tb->forward;
    out->logits_node = tb->forward_output;
    if (!g) INTERNAL("plan: the train build has no batch-1 forward");
    if (g->nparams != step->nparams) INTERNAL("plan: %d parameters at batch 1, %d in the step", g->nparams, step->nparams);
    for (int i = 0; i < g->nparams; i++)
        if (strcmp(graph_node(g, g->params[i])->name, graph_node(step, step->params[i])->name) != 0)
            INTERNAL("plan: parameter %d is '%s' at batch 1 but '%s' in the step", i, graph_node(g, g->params[i])->name,
                     graph_node(step, step->params[i])->name);
    out->why_no_logits = logits_refusal(g, out->logits_node, ts->seq, out->vocab, &out->no_logits_at, ar);
    if (out->why_no_logits) {
        out->logits_node = -1;
        return NULL;
    }
    for (int i = 0; i < g->n; i++) /* inference: dropout off */
        if (graph_node(g, i)->op == G_DROPOUT) graph_node(g, i)->fattr[0] = 0;
    if (graph_verify(g, stderr)) INTERNAL("the batch-1 forward graph fails graph_verify (problems above)");
    return g;
}

/* The chunk phase's geometry. Its rows (new tokens a call of forward_chunk) are the serve block's
 * batch.tokens - an iteration's whole budget, so the scheduler's iteration (a decode batch of up
 * to batch.seqs sequences, plus prefill chunks) is one call that reads every weight once - at most
 * KV_ROWS_MAX: the chunk arena grows with the rows (the logits alone are rows x vocab floats: 49
 * MiB for GPT-2 at 256 rows), and 256 sequences is vLLM's default max_num_seqs, so a decode batch
 * of up to 256 is still one call. An iteration with more tokens (prefill chunks beyond 256 rows:
 * compute-bound, where a second read of the weights costs little) is split by the engine. Without
 * a serve block, the serve block's default budget (2048, settings_serve.c), so 256. The pool: the
 * serve block's kv { block, dtype } (TrainBuild.serve), else blocks of KV_BLOCK tokens and an f32
 * pool (generate alone: the recompute path's precision); enough blocks for seq positions (the
 * longest context forward_logits takes). NULL, or why the pool's dtype cannot be carried out (fp8).
 * (docs/serve.md, "What a call computes") */
enum { KV_ROWS_MAX = PLAN_KV_ROWS_MAX, KV_ROWS_DEFAULT_TOKENS = 2048, KV_BLOCK = 16 };

const char *plan_kv_config(const TrainBuild *tb, KvConfig *kv) {
    const TrainConfig *ts = tb->config;
    const ServeConfig *sv = tb->serve;
    int64_t tokens = sv ? sv->tokens : KV_ROWS_DEFAULT_TOKENS;
    kv->rows = tokens < KV_ROWS_MAX ? tokens : KV_ROWS_MAX;
    kv->tokens = tokens;
    kv->block = sv ? sv->kv_block : KV_BLOCK;
    kv->max_blocks = (ts->seq + kv->block - 1) / kv->block;
    kv->kv_dt = DT_F32;
    if (!sv) return NULL;
    switch (sv->kv_dtype) {
    case KV_F32: kv->kv_dt = DT_F32; return NULL;
    case KV_BF16: kv->kv_dt = DT_BF16; return NULL;
    case KV_F16: kv->kv_dt = DT_F16; return NULL;
    case KV_FP8: break;
    }
    return "its serve block's kv.dtype fp8 is not supported by the cache's kernels (f32, bf16 and f16 are)";
}

int plan_schedules(const TrainBuild *tb, FuseResult *const fused[2], PlanSchedules *out, Arena *ar) {
    static const char *const prefix[PLAN_NPHASES] = {"step_", "update_", "logits_", "chunk_"};
    int errors = diag_error_count();
    memset(out, 0, sizeof *out);
    out->logits_node = out->chunk_node = -1;
    out->no_chunk_at = span_none();
    out->vocab = plan_find_vocab(tb->step);
    out->no_logits_at = span_none();
    const Graph *graphs[2] = {tb->step, tb->update};
    for (int i = 0; i < 2; i++) {
        out->g[i] = graphs[i];
        out->r[i] = fused[i];
        out->disjoint[i] = i == PLAN_STEP; /* the update's kernels may read and write one region */
    }
    out->n = 2;
    Graph *lg = logits_graph(tb, out, ar);
    if (diag_error_count() != errors) return 1;
    if (lg) {
        out->g[PLAN_LOGITS] = lg;
        out->r[PLAN_LOGITS] = fuse_graph(lg, &out->logits_node, 1, ar);
        out->disjoint[PLAN_LOGITS] = 1;
        out->n = 3;
        out->why_no_logits = NULL;
        out->why_no_chunk = plan_kv_config(tb, &out->kv);
        if (!out->why_no_chunk)
            out->why_no_chunk =
                kv_chunk_graph(lg, out->logits_node, tb->config->seq, &out->kv, &out->chunk, &out->no_chunk_at, ar);
        if (!out->why_no_chunk) {
            out->g[PLAN_CHUNK] = out->chunk.g;
            out->chunk_node = out->chunk.out;
            out->r[PLAN_CHUNK] = fuse_graph(out->chunk.g, &out->chunk_node, 1, ar);
            out->disjoint[PLAN_CHUNK] = 1;
            out->n = 4;
        }
    } else {
        out->why_no_chunk = "the program cannot generate (no logits forward)";
    }
    /* fused LoRA takes f32 products only (fuse_lower.c, fl_gemm_add and fl_lora_chain): say so for
     * a bf16 or f16 program with LoRA layers rather than fall back in silence */
    out->why_no_lora_fusion = NULL;
    int lora = 0;
    for (int k = 0; k < out->r[0]->nkernels; k++) lora += out->r[0]->kernels[k]->lora != NULL;
    if (tb->config->adapter_modules && *tb->config->adapter_modules && tb->config->precision != PREC_F32 && !lora &&
        fuse_lora_chain) {
        out->why_no_lora_fusion = tb->config->precision == PREC_BF16 ? "bf16" : "f16";
        out->no_lora_fusion_at = tb->config->at;
    }
    for (int i = 0; i < out->n; i++) {
        out->prefix[i] = prefix[i];
        if (fuse_verify(out->r[i], stderr)) INTERNAL("the fused %s graph fails fuse_verify (problems above)", prefix[i]);
    }
    return 0;
}

void plan_warn_no_logits(const PlanSchedules *s, const char *train) {
    if (!s->why_no_logits) return;
    diag_warning(s->no_logits_at, "train block '%s' compiles without generation: %s", train, s->why_no_logits);
    diag_hint("the executable is built without forward_logits: its generate command says that it cannot generate");
}

void plan_warn_lora_unfused(const PlanSchedules *s, const char *train) {
    if (!s->why_no_lora_fusion) return;
    diag_warning(s->no_lora_fusion_at,
                 "train block '%s': precision = %s: the LoRA layers' down and up products stay two GEMMs each (fused LoRA "
                 "takes f32 products)",
                 train, s->why_no_lora_fusion);
    diag_hint(
        "precision = f32 fuses them into one launch a layer (docs/architecture.md, \"Fusion\"); the step is the same either "
        "way");
}
