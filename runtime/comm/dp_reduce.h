/* dp_reduce.h - the data-parallel step's gradient summed over the ranks in buckets, by a
 * communication thread (docs/parallel.md, "Buckets and the communication thread").
 *
 * The gradient (n floats, the same layout on every rank) is cut into buckets of at most
 * `bucket_floats` elements, the last elements first (bucket 0 ends at n). Each bucket is reduced
 * like the whole vector without buckets: its shards exchanged (every rank receives every rank's
 * copy of its shard of the bucket, rank 0's first), summed by the step's tree over the ranks,
 * then gathered back. A thread of this module runs the collectives in a fixed order - exchange 0,
 * exchange 1, gather 0, exchange 2, gather 1, ... - while the calling thread sums bucket b's shard
 * (the tree over the ranks): the exchange of bucket b + 1 and the gather of bucket b - 1 overlap
 * that sum. rt_dp_reduce_begin .. finish instead overlaps the buckets with the backward.
 *
 * Each element's sum is the same additions in the same order at any bucket size, so the result
 * is bit for bit that of the unbucketed reduction. One thread at a time calls the collectives:
 * the caller must not call any while rt_dp_reduce_run, or begin .. finish, is under way. */
#ifndef MBT_DP_REDUCE_H
#define MBT_DP_REDUCE_H

#include <stdint.h>
#include <stdio.h>

#include "comm.h"
#include "rt_exec.h"

typedef struct RtDpReduce RtDpReduce;

/* The buckets' size from MBT_DP_BUCKET_MB (megabytes of floats, default 25, as PyTorch's DDP;
 * a positive number up to 1e6): *floats, rounded down to whole RT_GRAD_BLOCKs, at least one. */
RtStatus rt_dp_bucket_env(int64_t *floats, RtError *err);
/* A reducer of n-float vectors over the world c (size > 1), its thread started. */
RtStatus rt_dp_reduce_open(RtDpReduce **out, RtComm *c, RtPool *pool, int64_t n, int64_t bucket_floats, RtError *err);
/* ZeRO-2's buckets by shard (docs/parallel.md, "ZeRO-2's buckets overlapped with each backward"):
 * the same buckets (bucket 0 the last elements), each cut at the ZeRO shards' boundaries shard_off
 * (size + 1, kept by the caller) instead of into pieces of its own: piece k of bucket b is its
 * elements in shard k, empty where they do not meet. Only begin .. finish (the thread, during each
 * micro-batch's backward; fold NULL): each bucket's pieces exchanged, rank r's N copies summed by
 * the tree over the ranks and written back in place (the exchange has sent those elements), nothing
 * gathered. After finish, v[shard_off[r], shard_off[r + 1]) is the rank's shard of the micro-batch
 * block's sum: the same additions per element as the whole exchange (rt_dp_tree_sum_f32 is
 * elementwise). The receive buffer is one: N x the largest piece (at most N x bucket_floats). */
RtStatus rt_dp_reduce_open_shards(RtDpReduce **out, RtComm *c, int64_t n, int64_t bucket_floats, const int64_t *shard_off,
                                  RtError *err);
/* The receive buffers' bytes (every rank's copy of this rank's piece of a bucket). */
int64_t rt_dp_reduce_recv_bytes(const RtDpReduce *d);
int rt_dp_reduce_buckets(const RtDpReduce *d);
int64_t rt_dp_reduce_bucket_floats(const RtDpReduce *d);
/* v (n floats, host memory) summed over the ranks in place, every rank ending with the sum. */
RtStatus rt_dp_reduce_run(RtDpReduce *d, float *v, RtError *err);
/* The reduction overlapped with the backward (docs/parallel.md, "The reduction overlapped with
 * the backward"): rt_dp_reduce_begin before the step's last micro-batch; rt_dp_reduce_ready(lo,
 * hi) from the backward (rt_grad_ready) each time elements [lo, hi) of the local gradient have
 * had their last addition of that micro-batch; rt_dp_reduce_finish after it. The thread takes the
 * buckets in order (bucket 0 first, the same order on every rank), each once all its elements
 * that the backward writes are ready (rt_dp_reduce_expect: the ranges it writes, the whole
 * vector by default) or the backward has ended: fold(ctx, lo, hi) makes v[lo, hi) the rank's
 * final sum (the local tree's remaining additions there; NULL: nothing), then exchange, the
 * tree over the ranks (serial, on the thread) and gather. The same additions in the same order
 * per element as rt_dp_reduce_run: the same bits. No other collective may run between begin
 * and finish. */
typedef void (*RtDpFold)(void *ctx, int64_t lo, int64_t hi);
void rt_dp_reduce_expect(RtDpReduce *d, const int64_t *lo, const int64_t *hi, int n);
/* begin fails (nothing started) while the run before was not finished: finish is the join. */
RtStatus rt_dp_reduce_begin(RtDpReduce *d, float *v, RtDpFold fold, void *fold_ctx, RtError *err);
void rt_dp_reduce_ready(RtDpReduce *d, int64_t lo, int64_t hi); /* any thread */
RtStatus rt_dp_reduce_finish(RtDpReduce *d, RtError *err);
/* MBT_DEBUG: the buckets' line - how long the thread ran collectives and how long the caller
 * waited for it, over every run (the rest of the collectives' time was hidden behind the
 * caller's sums, or with the overlap behind the backward); after overlapped runs a second line:
 * how many buckets became ready, and how many the thread took, before rt_dp_reduce_finish (the
 * backward's end), and the largest such lead. */
void rt_dp_reduce_print(FILE *f, const RtDpReduce *d, const char *prefix);
void rt_dp_reduce_stats(const RtDpReduce *d, double *comm_s, double *wait_s, int64_t *runs);
void rt_dp_reduce_close(RtDpReduce *d); /* NULL is fine; stops the thread */

/* A model of the bucketed reduction overlapped with the backward, for a degree and an assumed
 * link bandwidth (MBT_DP_MODEL_GBPS; docs/parallel.md, "The overlap model"): n floats of gradient
 * in buckets of bucket_floats (bucket 0 the last elements), each reducing over `ranks` ranks as
 * built (exchange and gather: 2 x (ranks - 1) / ranks x 4 bytes an element sent by each rank, at
 * gbps x 1e9 bytes a second, one bucket at a time). The ASSUMPTION: the backward, bwd_s seconds,
 * produces the gradient at an even rate over the elements, last first, so bucket b is final when
 * the backward has produced it and everything after it. Then bucket b reduces from
 * max(ready, the previous bucket's end); exposed is how far the last one ends after the backward,
 * hidden = 1 - exposed / the buckets' total time. Rows for each bucket go to f (when not NULL),
 * each line prefixed. */
typedef struct {
    int nbuckets;
    double comm_s, exposed_s, hidden;
} RtDpModel;
void rt_dp_model(int64_t n, int64_t bucket_floats, int ranks, double gbps, double bwd_s, RtDpModel *m, FILE *f,
                 const char *prefix);
/* MBT_DP_MODEL_GBPS: *gbps (0 when it is not set); a value that is not a number above 0, at
 * most 1e6, is an error. */
RtStatus rt_dp_model_env(double *gbps, RtError *err);

/* The n pieces of len floats at v (piece i at v + i x len) summed in place by the step's tree
 * over the pieces (a binary counter, the older sum on the left, the rest folded from the right;
 * rt_exec.h's RtTree); the sum is the first piece. */
void rt_dp_tree_sum_f32(RtPool *pool, float *v, int n, int64_t len);
/* That tree's n - 1 additions in order, each add(ctx, a, b): piece a += piece b. The GPU's sum
 * over NCCL (train_dp.c) makes the same ones. */
void rt_dp_tree_walk(int n, void (*add)(void *ctx, int a, int b), void *ctx);

/* ZeRO-2's partial sums, shard-size (docs/parallel.md, "ZeRO-2's partial sums by shard"). With N
 * ranks, N a power of two, rank r runs the step's global micro-batches jN + r (j = 0 .. accum-1);
 * after each, every rank's gradient is exchanged by shards and rank r sums its shard's N copies
 * by rt_dp_tree_sum_f32 - an aligned block of N micro-batches, a node of the reference tree - and
 * pushes that block sum here: the same binary counter as RtTree (rt_exec.h) over the step's
 * blocks, on regions of the shard's len floats. Pushing block sums into this counter makes, per
 * element, the additions rt_exec_tree_push and _finish make over all N x accum micro-batches (the
 * counter over them forms each aligned block of N first, and what is left over is a multiple of
 * N): one process's bits.
 *
 * The leaf pushed is the caller's (its scratch); it is copied only where the counter keeps it on
 * the stack, so floor(log2 leaves) regions suffice (the stack holds popcount(k) sums after k
 * leaves, k < leaves; the last leaf is always added into one of them). */
typedef struct RtShardOps RtShardOps;
typedef struct RtShardTree {
    RtTree t;                /* the counter: depth, the leaves under each region */
    float *reg[RT_TREE_MAX]; /* nreg regions of len floats */
    int nreg;
    int64_t len;
    /* where the regions are: NULL, host memory (rt_shard_tree_open's, the additions rt_host_add's
     * on pool); else the caller's (the GPU's: rt_gpu_axpy with scale 1 and rt_gpu_copy), who
     * allocates reg[0 .. rt_shard_tree_regions(leaves)) and frees them */
    const RtShardOps *ops;
    RtPool *pool;
} RtShardTree;
struct RtShardOps {
    RtStatus (*add)(void *ctx, float *dst, const float *src, int64_t n, RtError *err); /* dst += src, each rounded once */
    RtStatus (*copy)(void *ctx, float *dst, const float *src, int64_t n, RtError *err);
    void *ctx;
};
/* The regions `leaves` pushes a step need: floor(log2 leaves); -1 past RT_TREE_MAX. */
int rt_shard_tree_regions(int64_t leaves);
/* Host regions for `leaves` pushes a step of len-float leaves, added on pool; *s zeroed first by
 * the caller. */
RtStatus rt_shard_tree_open(RtShardTree *s, int64_t len, int64_t leaves, RtPool *pool, RtError *err);
/* The step's first push comes next (the stack empty). */
void rt_shard_tree_reset(RtShardTree *s);
/* leaf (len floats) pushed; with last set it is the step's last, the stack is folded from the
 * right (rt_exec_tree_finish's additions) and *sum is the step's sum (a region of s, or leaf
 * itself when it is the only one). An error when more leaves come than s was opened for. */
RtStatus rt_shard_tree_push(RtShardTree *s, const float *leaf, int last, const float **sum, RtError *err);
/* The regions' bytes (what the partial sums hold besides the gradient region). */
int64_t rt_shard_tree_bytes(const RtShardTree *s);
void rt_shard_tree_close(RtShardTree *s); /* the host's regions freed (the caller's are its own) */

#endif
