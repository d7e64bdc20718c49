/* fuse_kv.h - the paged KV cache's kernels (issue 17): writing new tokens' keys and values into
 * the pool, and attention of new tokens over their sequence's cached prefix plus the chunk.
 *
 * Pipeline position: fusion's code generator (beside fuse_codegen_dedicated.c's attention); the
 * kernels are kernel IR (kir.h), so the CPU back end lowers them as any other kernel and kir_ref
 * interprets them. They are the attention half of a forward over new tokens only: the tokens of a
 * launch are N rows, each with its own sequence and position (a decode is one row of a sequence,
 * a prefill chunk several consecutive rows of one), so several sequences of different lengths
 * share one launch.
 *
 * The pool of one layer is two buffers (keys, values), each [slots, Hk, D] in kv_dt (f32 or
 * bf16), slots = blocks x block. Position p of a sequence is slot table[seq][p / block] * block +
 * p % block: the block table (seqs rows of max_blocks block ids, i32) is the runtime's
 * (runtime/serve's block manager). Per row t of a launch the runtime passes
 *   - slot[t]: where row t's key and value go (-1: a padding row, nothing written);
 *   - pos[t]:  its position in its sequence (keys 0 .. pos[t] are visible: causal over the cached
 *              prefix and the rows of the chunk before it);
 *   - seq[t]:  its row of the block table (-1: a padding row, its output is zeros).
 * The write kernel must run before the attention kernel of the same layer (a chunk's rows see
 * each other's keys through the pool).
 *
 * Numerics: the attention kernel computes a query row exactly as cg_attention does (the same
 * two passes over the visible keys in order, the same dot products, the output accumulated in its
 * buffer), so with an f32 pool a row's result is bit for bit the unpaged kernel's on the same
 * q, k, v; with a bf16 pool the keys and values are rounded to bf16 (nearest even) when written
 * and widened exactly when read. */
#ifndef MBT_FUSE_KV_H
#define MBT_FUSE_KV_H

#include "kir.h"

typedef struct KvAttnShape {
    int64_t N;                /* rows (new tokens) of a launch */
    int64_t H, Hk, D;         /* query heads, key/value heads (H a multiple of Hk), head width */
    int64_t block;            /* tokens per KV block */
    int64_t seqs, max_blocks; /* the block table's shape */
    int64_t slots;            /* slots of one layer's pool (its buffers' first axis) */
    DType dt;                 /* of q, k, v and the output (f32, or bf16/f16 computed in f32) */
    DType kv_dt;              /* of the pool: DT_F32 or DT_BF16 */
    double scale;             /* of the scores: scale * (q . k) */
    /* the sources, as strided views [1, heads, N, D] (KView.stride[0] unused) of nsrc source
     * buffers of src_numel[i] elements each: q, k, v may be slices of one projection's output */
    int nsrc;
    int64_t src_numel[3];
    KView q, k, v;
    KView out; /* the result [1, H, N, D], a view of the output buffer (out_numel elements) */
    int64_t out_numel;
} KvAttnShape;

/* Buffer parameters of the kernels below, in order. Write: the sources (0 .. nsrc-1), then
 * slot i32[N], kpool, vpool (written). Attention: the sources, then kpool, vpool, pos i32[N],
 * seq i32[N], table i32[seqs, max_blocks], out (written). KBuf.buffer is -1 and KBuf.node -1
 * (the caller binds them). */
enum { KV_W_SLOT, KV_W_KPOOL, KV_W_VPOOL };                                /* + nsrc */
enum { KV_A_KPOOL, KV_A_VPOOL, KV_A_POS, KV_A_SEQ, KV_A_TABLE, KV_A_OUT }; /* + nsrc */

/* One work item per (row, key/value head): the row's key and value into its slot. */
Kernel *kv_write_kernel(Arena *ar, const char *name, const KvAttnShape *s);

/* One work item per (row, query head): softmax(scale q k^T) v over the row's visible keys. */
Kernel *kv_attn_kernel(Arena *ar, const char *name, const KvAttnShape *s);

/* A one-line problem with s, or NULL when the kernels can be built for it. */
const char *kv_shape_problem(const KvAttnShape *s);

#endif
