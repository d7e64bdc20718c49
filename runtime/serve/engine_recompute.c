/* engine_recompute.c - the reference RtEngine: each sequence that wants logits runs through the
 * program's forward_logits over its whole context, as `generate` does; no KV cache.
 *
 * Pipeline position: runtime/serve/, behind engine.h. It is the engine every serving test can
 * trust (its logits are forward_logits', which the exec layer holds to the training forward's
 * loss), and the one a cached engine is compared with. O(context) work per new token, one
 * sequence at a time; each sequence's logits are computed alone, so they cannot depend on the
 * batch. Chunks that want no logits (the middle of a long prompt) cost nothing here. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static RtStatus recompute_step(RtEngine *e, RtEngineSeq *seqs, int64_t nseqs, RtError *err) {
    RtExec *x = e->x;
    int64_t T = x->prog->logits_seq;
    for (int64_t i = 0; i < nseqs; i++) {
        RtEngineSeq *q = &seqs[i];
        if (!q->logits) continue;
        int64_t len = q->start + q->n;
        if (len < 1 || len > T)
            return rt_fail(err, RT_ERR_ARG, "internal error: request %lld asks for the logits of position %lld of %lld",
                           (long long)q->id, (long long)(len - 1), (long long)T);
        memset(x->x, 0, (size_t)T * sizeof *x->x);
        memcpy(x->x, q->tokens, (size_t)len * sizeof *x->x);
        RtStatus st = rt_exec_batch(x, T, err);
        if (st != RT_OK) return st;
        RtStep s = rt_exec_step(x, err);
        s.B = 1, s.T = T, s.len = len, s.logits = q->logits, s.seed = 0;
        st = rt_exec_call(x, RT_EXEC_FORWARD_LOGITS, &s);
        if (st != RT_OK) return st;
        e->calls++;
        if (q->n > e->call_rows_max) e->call_rows_max = q->n;
    }
    return RT_OK;
}

static void recompute_close(RtEngine *e) { (void)e; }

static const RtEngineOps recompute_ops = {"recompute", recompute_step, recompute_close};

RtStatus rt_engine_open_recompute(RtEngine *e, RtExec *x, int64_t block, RtError *err) {
    memset(e, 0, sizeof *e);
    if (!x->prog->forward_logits)
        return rt_fail(err, RT_ERR_ARG, "this program cannot serve: it was compiled without a logits forward (mbtc warned why)");
    e->ops = &recompute_ops;
    e->x = x;
    e->vocab = x->prog->train.vocab;
    e->context = x->prog->logits_seq;
    e->block = block;
    e->kv_bytes_per_token = 0;
    return RT_OK;
}

RtStatus rt_engine_step(RtEngine *e, RtEngineSeq *seqs, int64_t nseqs, RtError *err) { return e->ops->step(e, seqs, nseqs, err); }

RtStatus rt_engine_pool(RtEngine *e, int64_t nblocks, RtError *err) {
    e->nblocks = nblocks;
    if (e->kv_bytes_per_token == 0) return RT_OK;
    size_t bytes = (size_t)nblocks * (size_t)e->block * (size_t)e->kv_bytes_per_token;
    if (e->x && e->x->gpu) return rt_gpu_alloc(e->x->gpu, &e->kv_pool, (int64_t)bytes, "the KV pool", err); /* zeroed */
    e->kv_pool = calloc(1, bytes);
    if (!e->kv_pool) return rt_fail(err, RT_ERR_NOMEM, "cannot allocate the KV pool (%zu bytes)", bytes);
    return RT_OK;
}

void rt_engine_close(RtEngine *e) {
    if (!e || !e->ops) return;
    e->ops->close(e);
    if (e->x && e->x->gpu) rt_gpu_free(e->x->gpu, e->kv_pool);
    else free(e->kv_pool);
    e->kv_pool = NULL;
    e->ops = NULL;
}
