/* engine.h - the seam between the serving scheduler (sched.c) and the model: one call runs one
 * iteration's batch of sequences, each with its new tokens, and returns the logits of each
 * sequence's last new token. Also the paged KV cache's block manager (kv.c), which the scheduler
 * owns and which is independent of how the model uses the cache.
 *
 * Pipeline position: runtime/serve/. server.c (HTTP) -> sched.c (requests, batching, sampling)
 * -> an RtEngine (this interface) -> the program's generated functions. docs/serve.md describes
 * the whole; this header is the contract a model implementation must keep.
 *
 * Two implementations sit behind it:
 *   - the recompute engine (engine_recompute.c): every sequence that needs logits is run through
 *     the program's forward_logits over its whole context (B = 1, T = logits_seq), the reference
 *     path `generate` uses. It ignores the KV cache's contents (it reads `tokens` in full), so it
 *     is correct whatever the block tables say, and slow: O(context) per new token.
 *   - a cached engine (to come, from the compiler): a generated forward over a chunk of new tokens
 *     per sequence that reads the keys and values of positions [0, start) from the paged pool
 *     through the block table, writes those of [start, start + n) into it, and attends over both.
 *
 * The KV pool. `nblocks` blocks of `block` tokens each; block b of the pool holds, for every
 * layer, the keys and values of `block` consecutive positions of one sequence (the layout inside
 * a block is the engine's: RtEngine.kv_bytes_per_token says how many bytes one position takes,
 * and RtEngine.kv_pool is where the engine keeps them). A sequence's block table lists its blocks
 * in position order: positions [i * block, (i + 1) * block) are in block table[i]. Blocks can be
 * shared between sequences (prefix sharing): the scheduler guarantees that a shared block is full
 * and holds the same tokens at the same positions for every sequence that lists it, and that a
 * step never asks an engine to write into a shared block (new tokens always land in blocks owned
 * by their sequence alone). The engine never allocates or frees blocks. */
#ifndef MBT_SERVE_ENGINE_H
#define MBT_SERVE_ENGINE_H

#include <stdint.h>

#include "rt_exec.h"

/* ==== one iteration's batch ==================================================================== */

/* One sequence of a step. A decode has n = 1; a prefill chunk has 1 <= n <= prefill_chunk. */
typedef struct RtEngineSeq {
    int64_t id;                 /* the request's id (for an engine's own bookkeeping and messages) */
    const int32_t *tokens;      /* the sequence so far, tokens[0, start + n): the prompt, then what was generated */
    int64_t start;              /* position of the first new token: the cache holds positions [0, start) */
    int64_t n;                  /* new tokens: tokens[start, start + n), whose keys and values the step writes */
    const int32_t *block_table; /* the sequence's blocks, position order; covers [0, start + n) */
    int64_t nblocks;            /* entries of block_table: ceil((start + n) / block) at least */
    float *logits;              /* out: [vocab] logits of position start + n - 1; NULL: not wanted (a mid-prompt chunk) */
} RtEngineSeq;

typedef struct RtEngine RtEngine;

/* An implementation: its name (in the server's start-up line and /metrics) and functions. */
typedef struct RtEngineOps {
    const char *name;
    /* Runs one step over seqs[0, nseqs) (distinct requests, each at most once). For every sequence,
     * the keys and values of its new tokens are in the pool afterwards, and its logits, where asked
     * for, equal forward_logits over tokens[0, start + n) (bit-identical on the CPU: a sequence's
     * results never depend on what else is in the batch). */
    RtStatus (*step)(RtEngine *e, RtEngineSeq *seqs, int64_t nseqs, RtError *err);
    void (*close)(RtEngine *e); /* frees what open allocated (not the RtExec, which the caller owns) */
} RtEngineOps;

/* An opened engine. The caller opens the RtExec (device, pool, weights loaded and pushed). */
struct RtEngine {
    const RtEngineOps *ops;
    RtExec *x;                  /* the program's regions, weights loaded */
    int64_t vocab;              /* logits per sequence */
    int64_t context;            /* the longest sequence (prompt + generated) the model takes: logits_seq */
    int64_t block;              /* tokens a KV block */
    int64_t kv_bytes_per_token; /* the cache's bytes for one position over all layers (0: the engine keeps no cache) */
    void *kv_pool;              /* nblocks x block x kv_bytes_per_token bytes (NULL without a cache), in
                                   the memory of x's device (rt_engine_pool) */
    int64_t nblocks;            /* blocks of the pool, set by rt_engine_pool before the first step */
    /* what the steps cost, for the scheduler's metrics: the model's forward calls so far
     * (forward_chunk, or forward_logits per sequence), and the most new tokens one call has held;
     * call_rows is the most a call takes (RtKvInfo.rows; 0: one sequence a call) */
    int64_t calls, call_rows_max, call_rows;
    void *impl; /* the implementation's own state */
};

/* The recompute engine (engine_recompute.c) on an opened RtExec. */
RtStatus rt_engine_open_recompute(RtEngine *e, RtExec *x, int64_t block, RtError *err);
/* The cached engine (engine_cached.c): the program's forward_chunk over the paged pool, on x's
 * device (the GPU's forward_chunk where x runs on the GPU); block must be the program's
 * RtKvInfo.block. */
RtStatus rt_engine_open_cached(RtEngine *e, RtExec *x, int64_t block, RtError *err);
/* Runs one step (e->ops->step). */
RtStatus rt_engine_step(RtEngine *e, RtEngineSeq *seqs, int64_t nseqs, RtError *err);
/* Allocates the pool: nblocks x block x kv_bytes_per_token bytes (nothing without a cache), zeroed,
 * in device memory when the engine's RtExec runs on the GPU. */
RtStatus rt_engine_pool(RtEngine *e, int64_t nblocks, RtError *err);
void rt_engine_close(RtEngine *e); /* NULL ops is fine */

/* ==== the KV block manager (kv.c) ============================================================== */

/* Blocks are reference-counted. A block with references is in use; one without is free, and a
 * free block that was filled with a full block's tokens keeps its hash (the tokens it holds and a
 * hash of everything before them) and can be taken back by a later sequence with the same prefix,
 * until it is evicted: allocation takes never-hashed free blocks first, then the free hashed block
 * least recently used. */
typedef struct RtKv RtKv;

RtStatus rt_kv_open(RtKv **out, int64_t nblocks, int64_t block, RtError *err);
void rt_kv_close(RtKv *kv);
int64_t rt_kv_free_blocks(const RtKv *kv);   /* blocks with no reference (hashed or not) */
int64_t rt_kv_used_blocks(const RtKv *kv);   /* blocks with references */
int64_t rt_kv_cached_blocks(const RtKv *kv); /* free blocks that still hold a hashed prefix */

/* A sequence's block table. */
typedef struct RtKvSeq {
    int32_t *blocks; /* position order */
    int64_t n, cap;
    int64_t nhashed;    /* blocks[0, nhashed) are full and registered (or found) under their hash */
    uint64_t last_hash; /* the chain hash of blocks[nhashed - 1] (0 when nhashed == 0) */
} RtKvSeq;

/* Finds the longest run of full blocks of tokens[0, len) already cached, stopping before the
 * block that holds position max_pos (whose logits must be computed), takes a reference to each
 * and appends them to s (which must be empty). Returns the positions covered (a multiple of block). */
int64_t rt_kv_match_prefix(RtKv *kv, RtKvSeq *s, const int32_t *tokens, int64_t len, int64_t max_pos);
/* Appends blocks to s until it covers `positions` positions; 0, or -1 when too few blocks are
 * free (s is then unchanged). */
int rt_kv_grow(RtKv *kv, RtKvSeq *s, int64_t positions);
/* Registers s's blocks that are full of computed positions [0, computed) under their hash, so
 * later sequences can share them. */
void rt_kv_commit(RtKv *kv, RtKvSeq *s, const int32_t *tokens, int64_t computed);
/* Drops s's references (hashed blocks stay cached until evicted) and empties s. */
void rt_kv_release(RtKv *kv, RtKvSeq *s);
void rt_kv_seq_free(RtKvSeq *s);    /* frees the table's memory (after rt_kv_release) */
int64_t rt_kv_hits(const RtKv *kv); /* blocks found by rt_kv_match_prefix so far */

#endif
