/* fuse_kv.h - the paged KV cache's attention kernel (issue 17): the new tokens' keys and values
 * written into the pool, and attention of the new tokens over their sequence's cached prefix plus
 * the chunk.
 *
 * Pipeline position: fusion's code generator (beside fuse_codegen_dedicated.c's attention); the
 * kernel is kernel IR (kir.h), so the CPU back end lowers it as any other kernel and kir_ref
 * interprets it. It is the attention of a forward over new tokens only (graph.h,
 * G_KV_ATTENTION): the N rows of a launch are tokens, each with its own sequence and position (a
 * decode is one row of a sequence, a prefill chunk consecutive rows of one), so sequences of
 * different lengths share a launch.
 *
 * The metadata (one i32 buffer, N rows; the runtime fills it, runtime/serve/engine_cached.c):
 *   pos[N]    at KV_META_POS * N:   the row's position in its sequence
 *   seq[N]    at KV_META_SEQ * N:   its row of the block table; -1: a padding row (output zeros,
 *                                   nothing written)
 *   start[N]  at KV_META_START * N: the position of its sequence's first row in this launch (the
 *                                   rows of one sequence are consecutive, positions ascending)
 *   slot[N]   at KV_META_SLOT * N:  where its key and value go in the pool
 *   table     at KV_META_TABLE * N: N rows of max_blocks block ids (a sequence's blocks in order)
 * so M = N * (4 + max_blocks) elements. The pool is slot-major over every layer: element
 * (slot, layer, k or v, kv head, c) at pool_off + slot * L*2*Hk*D + ((layer*2 + kv)*Hk + head)*D
 * + c, in kv_dt (f32 or bf16), slot = block id * block + position % block: a block holds all
 * layers' keys and values of `block` consecutive positions (runtime/serve/engine.h).
 *
 * One work item per (row t, query head h); it
 *   - writes row t's key and value of kv head h / (H / Hk) to slot[t] (the first query head of
 *     each kv head does), rounded to kv_dt;
 *   - attends over keys j = 0 .. pos[t]: j < start[t] from the pool (positions cached by earlier
 *     launches, which no work item of this launch writes), j >= start[t] from the sources at row
 *     t - pos[t] + j (this launch's rows, rounded to kv_dt as the pool would hold them), so a
 *     chunk's rows need no ordering between work items.
 * Numerics: the same two passes over the visible keys in order, the same dot products and the
 * output accumulated in its buffer as cg_attention, so with an f32 pool a row's result is bit for
 * bit the unpaged kernel's on the same q, k, v, however the positions were split into launches;
 * with bf16 keys and values are rounded to bf16 (nearest even) and widened exactly. */
#ifndef MBT_FUSE_KV_H
#define MBT_FUSE_KV_H

#include "kir.h"

enum { KV_META_POS, KV_META_SEQ, KV_META_START, KV_META_SLOT, KV_META_TABLE };

/* The kernel's shape: kir.h's KKvAttn (its meta and pool set by kv_emit_attn). */
typedef KKvAttn KvAttnShape;

/* The metadata's elements for N rows. */
int64_t kv_meta_numel(int64_t N, int64_t max_blocks);

/* A one-line problem with s, or NULL when the kernel can be built for it. */
const char *kv_shape_problem(const KvAttnShape *s);

/* Appends the body to b's kernel: the views' params, meta (i32) and pool (kv_dt, written) and
 * the output's param (written) must be the kernel's. Sets the kernel's grid to N * H and its kv
 * (a copy of s with meta and pool, for a back end's kernel of its own). */
void kv_emit_attn(KBuilder *b, Kernel *k, const KvAttnShape *s, int meta, int pool);

/* A kernel of its own: parameters 0 .. nsrc-1 the sources (src_numel elements of s->dt each, the
 * views' params index them), then meta, pool ([pool_numel] of kv_dt) and out (out_numel). */
Kernel *kv_attn_kernel(Arena *ar, const char *name, const KvAttnShape *s, int nsrc, const int64_t *src_numel, int64_t pool_numel,
                       int64_t out_numel);

#endif
