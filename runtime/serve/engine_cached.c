/* engine_cached.c - the RtEngine over the program's forward_chunk: the forward over new tokens
 * only, with keys and values in the paged KV pool (compiler/plan/kv.c builds it; the attention
 * kernel is compiler/fuse/fuse_kv.h's).
 *
 * Pipeline position: runtime/serve/, behind engine.h, beside the recompute engine it is compared
 * with; `generate` uses it too (runtime/cli/generate.c). A step packs the sequences' new tokens
 * into calls of RtKvInfo.rows rows, in order: every sequence's tokens are consecutive rows, a
 * sequence longer than what is left of a call continues in the next (its later rows then see the
 * earlier ones through the pool), and the last call is padded with rows of no sequence. Each row
 * is computed from its own token and position and its sequence's keys and values alone, and the
 * chunk phase's GEMMs (rt_sgemm_rows_batched) round a row the same wherever it sits in a call,
 * so a sequence's logits are bit for bit a run alone's whatever the batch and the chunking; they
 * agree with forward_logits (OpenBLAS) to about 1e-6 relative (docs/serve.md, "Numerics").
 * RtStep.len tells forward_chunk how many rows a call uses (its GEMMs compute those only).
 * On the GPU (the RtExec's device) the pool is in device memory (rt_engine_pool), and each call
 * uploads the rows' tokens and the metadata - block tables included - before the GPU's
 * forward_chunk, which downloads the logits and waits; its GEMMs run all rows (a fixed shape), its
 * attention is runtime/kernels/rt_kv_attention.cuh. A sequence's logits there do not depend on the
 * rest of the batch either, but differ from the CPU's in rounding (docs/serve.md, "On the GPU"). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct RtCached {
    int32_t *meta;   /* RtKvInfo's metadata: rows x (4 + max_blocks) */
    int32_t *d_meta; /* on the GPU: its copy in device memory, uploaded each call (NULL on the CPU) */
    float *logits;   /* [rows x vocab]: the used rows', from forward_chunk */
    int64_t *want;   /* [rows]: the sequence whose logits row r holds, -1 */
} RtCached;

enum { META_POS, META_SEQ, META_START, META_SLOT, META_TABLE }; /* compiler/fuse/fuse_kv.h's KV_META_* */

static RtStatus cached_check(const RtEngine *e, const RtEngineSeq *q, RtError *err) {
    const RtKvInfo *kv = &e->x->prog->kv;
    int64_t end = q->start + q->n;
    if (q->n < 1 || q->start < 0 || end > e->context)
        return rt_fail(err, RT_ERR_ARG, "internal error: request %lld asks for positions %lld..%lld of a context of %lld",
                       (long long)q->id, (long long)q->start, (long long)(end - 1), (long long)e->context);
    int64_t need = (end + kv->block - 1) / kv->block;
    if (q->nblocks < need || need > kv->max_blocks)
        return rt_fail(err, RT_ERR_ARG, "internal error: request %lld has %lld blocks for %lld positions", (long long)q->id,
                       (long long)q->nblocks, (long long)end);
    for (int64_t b = 0; b < need; b++)
        if (q->block_table[b] < 0 || q->block_table[b] >= e->nblocks)
            return rt_fail(err, RT_ERR_ARG, "internal error: request %lld names block %d of a pool of %lld", (long long)q->id,
                           (int)q->block_table[b], (long long)e->nblocks);
    return RT_OK;
}

/* One call of forward_chunk over the rows packed so far; copies the logits rows asked for. */
static RtStatus cached_call(RtEngine *e, RtEngineSeq *seqs, int64_t rows, RtError *err) {
    RtCached *c = e->impl;
    RtExec *x = e->x;
    const RtKvInfo *kv = &x->prog->kv;
    RtStatus st = RT_OK;
    if (x->gpu) { /* the tokens (rt_exec_batch: x into d_x) and the metadata to the device */
        st = rt_exec_batch(x, kv->rows, err);
        if (st == RT_OK) st = rt_gpu_upload(x->gpu, c->d_meta, c->meta, kv->meta_bytes, err);
        if (st != RT_OK) return st;
    }
    RtStep s = rt_exec_step(x, err);
    s.B = 1, s.T = kv->rows, s.len = rows, s.logits = c->logits, s.kv = x->gpu ? c->d_meta : c->meta, s.kv_pool = e->kv_pool;
    st = rt_exec_call(x, RT_EXEC_FORWARD_CHUNK, &s);
    if (st != RT_OK) return st;
    e->calls++;
    if (rows > e->call_rows_max) e->call_rows_max = rows;
    for (int64_t r = 0; r < rows; r++)
        if (c->want[r] >= 0) memcpy(seqs[c->want[r]].logits, c->logits + r * e->vocab, (size_t)e->vocab * sizeof(float));
    return RT_OK;
}

/* Row r empty: no sequence, token 0. */
static void cached_clear(RtEngine *e) {
    RtCached *c = e->impl;
    const RtKvInfo *kv = &e->x->prog->kv;
    int64_t R = kv->rows;
    memset(e->x->x, 0, (size_t)R * sizeof(int32_t));
    for (int64_t r = 0; r < R; r++) {
        c->meta[META_POS * R + r] = 0, c->meta[META_SEQ * R + r] = -1;
        c->meta[META_START * R + r] = 0, c->meta[META_SLOT * R + r] = -1;
        c->want[r] = -1;
    }
    memset(c->meta + META_TABLE * R, 0, (size_t)(R * kv->max_blocks) * sizeof(int32_t));
}

static RtStatus cached_step(RtEngine *e, RtEngineSeq *seqs, int64_t nseqs, RtError *err) {
    RtCached *c = e->impl;
    const RtKvInfo *kv = &e->x->prog->kv;
    int64_t R = kv->rows, B = kv->max_blocks;
    for (int64_t i = 0; i < nseqs; i++) {
        RtStatus st = cached_check(e, &seqs[i], err);
        if (st != RT_OK) return st;
    }
    int64_t rows = 0, nseq = 0;
    cached_clear(e);
    for (int64_t i = 0; i < nseqs; i++) {
        const RtEngineSeq *q = &seqs[i];
        for (int64_t done = 0; done < q->n;) {
            if (rows == R) { /* this call is full: run it, continue in the next */
                RtStatus st = cached_call(e, seqs, rows, err);
                if (st != RT_OK) return st;
                rows = nseq = 0;
                cached_clear(e);
            }
            int64_t take = q->n - done < R - rows ? q->n - done : R - rows, first = q->start + done, sid = nseq++;
            int64_t nb = (first + take + kv->block - 1) / kv->block;
            memcpy(c->meta + META_TABLE * R + sid * B, q->block_table, (size_t)nb * sizeof(int32_t));
            for (int64_t t = 0; t < take; t++) {
                int64_t r = rows + t, pos = first + t;
                e->x->x[r] = q->tokens[pos];
                c->meta[META_POS * R + r] = (int32_t)pos;
                c->meta[META_SEQ * R + r] = (int32_t)sid;
                c->meta[META_START * R + r] = (int32_t)first;
                c->meta[META_SLOT * R + r] = (int32_t)(q->block_table[pos / kv->block] * kv->block + pos % kv->block);
            }
            done += take;
            rows += take;
            if (done == q->n && q->logits) c->want[rows - 1] = i;
        }
    }
    return rows ? cached_call(e, seqs, rows, err) : RT_OK;
}

static void cached_close(RtEngine *e) {
    RtCached *c = e->impl;
    if (!c) return;
    if (e->x && e->x->gpu) rt_gpu_free(e->x->gpu, c->d_meta);
    free(c->meta);
    free(c->logits);
    free(c->want);
    free(c);
    e->impl = NULL;
}

static const RtEngineOps cached_ops = {"cached", cached_step, cached_close};

RtStatus rt_engine_open_cached(RtEngine *e, RtExec *x, int64_t block, RtError *err) {
    memset(e, 0, sizeof *e);
    const RtProgram *p = x->prog;
    const RtKvInfo *kv = &p->kv;
    if (!p->forward_chunk || kv->rows < 1)
        return rt_fail(err, RT_ERR_ARG,
                       "this program has no KV cache: its model cannot run over new tokens alone (mbtc --emit=plan "
                       "says why under 'phase chunk')");
    if (x->gpu && (!p->gpu || !p->gpu->forward_chunk))
        return rt_fail(err, RT_ERR_ARG,
                       "this program's GPU side has no forward_chunk (it was built before the chunk phase ran on the GPU)");
    if (block != kv->block)
        return rt_fail(err, RT_ERR_ARG, "the program's KV cache was compiled with blocks of %lld tokens, not %lld",
                       (long long)kv->block, (long long)block);
    RtCached *c = calloc(1, sizeof *c);
    if (c) {
        c->meta = calloc((size_t)(kv->rows * (META_TABLE + kv->max_blocks)), sizeof(int32_t));
        c->logits = malloc((size_t)(kv->rows * p->train.vocab) * sizeof(float));
        c->want = malloc((size_t)kv->rows * sizeof(int64_t));
    }
    e->impl = c;
    e->ops = &cached_ops;
    e->x = x;
    RtStatus st = RT_OK;
    if (c && x->gpu) st = rt_gpu_alloc(x->gpu, (void **)&c->d_meta, kv->meta_bytes, "the KV cache's metadata", err);
    if (st != RT_OK) {
        cached_close(e);
        e->ops = NULL;
        return st;
    }
    if (!c || !c->meta || !c->logits || !c->want) {
        cached_close(e);
        e->ops = NULL;
        return rt_fail(err, RT_ERR_NOMEM, "cannot allocate the KV cache engine's buffers");
    }
    e->x = x;
    e->vocab = p->train.vocab;
    e->context = p->logits_seq < kv->max_blocks * kv->block ? p->logits_seq : kv->max_blocks * kv->block;
    e->block = block;
    e->call_rows = kv->rows;
    e->kv_bytes_per_token = kv->bytes_per_token;
    return RT_OK;
}
