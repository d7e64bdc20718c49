/* kv.h - the forward over new tokens with a paged KV cache (kv.c): the batch-1 forward graph
 * rewritten for N rows of new tokens whose attention reads and writes the pool (fuse_kv.h).
 *
 * Pipeline position: plan (schedules.c, the chunk phase) -> fuse -> host (forward_chunk). */
#ifndef MBT_PLAN_KV_H
#define MBT_PLAN_KV_H

#include "graph.h"

typedef struct KvConfig {
    int64_t rows;       /* N: new tokens per call of forward_chunk (batch.tokens, at most 256) */
    int64_t tokens;     /* the batch.tokens it came from (the serve block's default without one) */
    int64_t block;      /* tokens per KV block */
    int64_t max_blocks; /* blocks of one sequence: ceil(context / block) */
    DType kv_dt;        /* the pool's: DT_F32, DT_BF16 or DT_F16 */
} KvConfig;

typedef struct KvChunk {
    Graph *g;                /* inputs data.x i32[1, N] and kv i32[meta] (the pool after it) */
    int out;                 /* the logits [1, N, vocab] */
    int layers;              /* attention ops: the pool's layers */
    int64_t heads_kv;        /* key/value heads of every layer */
    int64_t head_dim;        /* their width */
    int64_t meta_bytes;      /* the metadata's bytes: the kv input */
    int64_t bytes_per_token; /* the pool's bytes for one position over all layers */
    /* per node of g (ntoken_axis of them): its token axis when the node is token-wise (row i of
     * that axis depends on the call's row i alone), else -1 (constant, position-table rows, the
     * metadata, or unknown): what lets the CPU's fused kernels run the rows a call uses alone
     * (host.c, chunk_kernel_rows) */
    const signed char *token_axis;
    int ntoken_axis;
} KvChunk;

/* The forward graph g (batch 1, T positions, logits at node out) over cfg->rows new tokens with
 * the cache, into res; NULL, or why the model cannot use the cache (with *at where, span_none
 * when nowhere). g is not changed. */
const char *kv_chunk_graph(const Graph *g, int out, int64_t T, const KvConfig *cfg, KvChunk *res, Span *at, Arena *ar);

/* Whether the batch-1 forward g (T positions) keeps each window of a row apart when data.pos
 * restarts at every window (sequence-length buckets): NULL, or why not, with *at where. */
const char *kv_window_local(const Graph *g, int64_t T, Span *at, Arena *ar);

#endif
