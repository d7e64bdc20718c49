/* kv.c - the paged KV cache's block manager: a pool of blocks with reference counts, block tables,
 * prefix sharing by hash, and least-recently-used eviction (engine.h has the contract).
 *
 * Pipeline position: runtime/serve/, owned by the scheduler (sched.c); it knows nothing of the
 * model, only block numbers and the tokens they hold.
 *
 * Prefix sharing as vLLM's automatic prefix caching does it: a full block is keyed by the hash of
 * its tokens chained with the hash of the block before it (XXH3-64 seeded with the parent's hash),
 * so a key names the whole prefix up to the block's end. A match is confirmed on the parent hash
 * and the block's tokens themselves (kept beside the block), so a 64-bit collision between two
 * different blocks with the same parent cannot share wrong keys and values. Blocks whose last
 * reference goes keep their key and join an LRU list; allocation takes never-keyed blocks first,
 * then evicts from the list's old end. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL /* header-only: executables link no xxhash library */
#include <xxhash.h>

#include "engine.h"

typedef struct KvBlock {
    int32_t ref;
    int32_t keyed;              /* holds a full block registered under hash */
    uint64_t hash, parent;      /* chain hash of the prefix ending here; the block before's */
    int32_t next_in_bucket;     /* hash chain, -1 ends */
    int32_t lru_prev, lru_next; /* free keyed blocks, oldest first; -1 ends */
} KvBlock;

struct RtKv {
    int64_t nblocks, block;
    KvBlock *b;
    int32_t *toks;       /* nblocks x block: the tokens a keyed block holds */
    int32_t *free_stack; /* free never-keyed (or evicted) blocks */
    int64_t nfree_stack;
    int32_t lru_head, lru_tail; /* free keyed blocks */
    int64_t nlru, nused, hits;
    int32_t *buckets; /* hash table heads, nbuckets (a power of two) */
    uint64_t nbuckets;
};

static uint64_t kv_hash(const RtKv *kv, uint64_t parent, const int32_t *tokens) {
    return XXH3_64bits_withSeed(tokens, (size_t)kv->block * sizeof *tokens, parent);
}

RtStatus rt_kv_open(RtKv **out, int64_t nblocks, int64_t block, RtError *err) {
    *out = NULL;
    if (nblocks < 1 || nblocks > INT32_MAX || block < 1)
        return rt_fail(err, RT_ERR_ARG, "a KV pool of %lld blocks of %lld tokens cannot be made", (long long)nblocks,
                       (long long)block);
    RtKv *kv = calloc(1, sizeof *kv);
    if (!kv) return rt_fail_errno(err, ENOMEM, "cannot allocate the KV block manager");
    kv->nblocks = nblocks, kv->block = block;
    kv->nbuckets = 1;
    while (kv->nbuckets < (uint64_t)nblocks * 2) kv->nbuckets *= 2;
    kv->b = calloc((size_t)nblocks, sizeof *kv->b);
    kv->toks = malloc((size_t)nblocks * (size_t)block * sizeof *kv->toks);
    kv->free_stack = malloc((size_t)nblocks * sizeof *kv->free_stack);
    kv->buckets = malloc(kv->nbuckets * sizeof *kv->buckets);
    if (!kv->b || !kv->toks || !kv->free_stack || !kv->buckets) {
        rt_kv_close(kv);
        return rt_fail_errno(err, ENOMEM, "cannot allocate the KV block manager for %lld blocks", (long long)nblocks);
    }
    for (uint64_t i = 0; i < kv->nbuckets; i++) kv->buckets[i] = -1;
    /* the stack pops block 0 first, so a fresh pool hands out blocks in order */
    for (int64_t i = 0; i < nblocks; i++) kv->free_stack[i] = (int32_t)(nblocks - 1 - i);
    kv->nfree_stack = nblocks;
    kv->lru_head = kv->lru_tail = -1;
    *out = kv;
    return RT_OK;
}

void rt_kv_close(RtKv *kv) {
    if (!kv) return;
    free(kv->b);
    free(kv->toks);
    free(kv->free_stack);
    free(kv->buckets);
    free(kv);
}

int64_t rt_kv_free_blocks(const RtKv *kv) { return kv->nfree_stack + kv->nlru; }
int64_t rt_kv_used_blocks(const RtKv *kv) { return kv->nused; }
int64_t rt_kv_cached_blocks(const RtKv *kv) { return kv->nlru; }
int64_t rt_kv_hits(const RtKv *kv) { return kv->hits; }

/* ---- the LRU list and the hash table ------------------------------------------------------------ */

static void lru_remove(RtKv *kv, int32_t id) {
    KvBlock *b = &kv->b[id];
    if (b->lru_prev >= 0) kv->b[b->lru_prev].lru_next = b->lru_next;
    else kv->lru_head = b->lru_next;
    if (b->lru_next >= 0) kv->b[b->lru_next].lru_prev = b->lru_prev;
    else kv->lru_tail = b->lru_prev;
    kv->nlru--;
}

static void lru_push(RtKv *kv, int32_t id) {
    KvBlock *b = &kv->b[id];
    b->lru_prev = kv->lru_tail, b->lru_next = -1;
    if (kv->lru_tail >= 0) kv->b[kv->lru_tail].lru_next = id;
    else kv->lru_head = id;
    kv->lru_tail = id;
    kv->nlru++;
}

static int32_t table_find(const RtKv *kv, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    for (int32_t id = kv->buckets[hash & (kv->nbuckets - 1)]; id >= 0; id = kv->b[id].next_in_bucket) {
        const KvBlock *b = &kv->b[id];
        if (b->hash == hash && b->parent == parent &&
            memcmp(kv->toks + (size_t)id * (size_t)kv->block, tokens, (size_t)kv->block * sizeof *tokens) == 0)
            return id;
    }
    return -1;
}

static void table_remove(RtKv *kv, int32_t id) {
    int32_t *p = &kv->buckets[kv->b[id].hash & (kv->nbuckets - 1)];
    while (*p != id) p = &kv->b[*p].next_in_bucket;
    *p = kv->b[id].next_in_bucket;
    kv->b[id].keyed = 0;
}

/* A free block for a new reference: a never-keyed one, else the least recently used keyed one
 * (evicted: its key goes). The caller checked that one is free. */
static int32_t kv_take(RtKv *kv) {
    int32_t id;
    if (kv->nfree_stack > 0) {
        id = kv->free_stack[--kv->nfree_stack];
    } else {
        id = kv->lru_head;
        lru_remove(kv, id);
        table_remove(kv, id);
    }
    kv->b[id].ref = 1;
    kv->nused++;
    return id;
}

static void kv_ref(RtKv *kv, int32_t id) {
    if (kv->b[id].ref++ == 0) {
        lru_remove(kv, id);
        kv->nused++;
    }
}

static void kv_unref(RtKv *kv, int32_t id) {
    if (--kv->b[id].ref > 0) return;
    kv->nused--;
    if (kv->b[id].keyed) lru_push(kv, id);
    else kv->free_stack[kv->nfree_stack++] = id;
}

/* ---- block tables ------------------------------------------------------------------------------- */

static int seq_reserve(RtKvSeq *s, int64_t n) {
    if (n <= s->cap) return 0;
    int64_t cap = s->cap ? s->cap : 8;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(s->blocks, (size_t)cap * sizeof *p);
    if (!p) return -1;
    s->blocks = p, s->cap = cap;
    return 0;
}

int64_t rt_kv_match_prefix(RtKv *kv, RtKvSeq *s, const int32_t *tokens, int64_t len, int64_t max_pos) {
    int64_t bs = kv->block, i = 0;
    uint64_t h = 0;
    for (; (i + 1) * bs <= len && (i + 1) * bs <= max_pos; i++) {
        uint64_t hi = kv_hash(kv, h, tokens + i * bs);
        int32_t id = table_find(kv, hi, h, tokens + i * bs);
        if (id < 0 || seq_reserve(s, s->n + 1) != 0) break;
        kv_ref(kv, id);
        s->blocks[s->n++] = id;
        kv->hits++;
        h = hi;
    }
    s->nhashed = i, s->last_hash = h;
    return i * bs;
}

int rt_kv_grow(RtKv *kv, RtKvSeq *s, int64_t positions) {
    int64_t want = (positions + kv->block - 1) / kv->block;
    if (want <= s->n) return 0;
    if (want - s->n > rt_kv_free_blocks(kv) || seq_reserve(s, want) != 0) return -1;
    while (s->n < want) s->blocks[s->n++] = kv_take(kv);
    return 0;
}

void rt_kv_commit(RtKv *kv, RtKvSeq *s, const int32_t *tokens, int64_t computed) {
    int64_t bs = kv->block;
    while ((s->nhashed + 1) * bs <= computed && s->nhashed < s->n) {
        const int32_t *t = tokens + s->nhashed * bs;
        uint64_t h = kv_hash(kv, s->last_hash, t);
        int32_t id = s->blocks[s->nhashed];
        /* A block already keyed (found by match_prefix) stays as it is; a duplicate of a block
         * someone else registered first stays unkeyed (it is freed, not cached, when released). */
        if (!kv->b[id].keyed && table_find(kv, h, s->last_hash, t) < 0) {
            KvBlock *b = &kv->b[id];
            b->keyed = 1, b->hash = h, b->parent = s->last_hash;
            memcpy(kv->toks + (size_t)id * (size_t)bs, t, (size_t)bs * sizeof *t);
            uint64_t k = h & (kv->nbuckets - 1);
            b->next_in_bucket = kv->buckets[k];
            kv->buckets[k] = id;
        }
        s->last_hash = h;
        s->nhashed++;
    }
}

void rt_kv_release(RtKv *kv, RtKvSeq *s) {
    /* last block first, so that a prefix's early blocks are the last of it to be evicted */
    for (int64_t i = s->n - 1; i >= 0; i--) kv_unref(kv, s->blocks[i]);
    s->n = 0, s->nhashed = 0, s->last_hash = 0;
}

void rt_kv_seq_free(RtKvSeq *s) {
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
