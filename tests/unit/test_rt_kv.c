/* test_rt_kv.c - unit tests of runtime/serve/kv.c, the paged KV cache's block manager: allocation
 * and release, prefix sharing by chained hash (hit, miss after a changed token, the block holding
 * the last prompt position never shared), reference counts, LRU eviction order, and a pool that
 * runs out.
 *
 * Build: make build/tests/test_rt_kv (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`. */
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "unit.h"

static void grow_and_release(void) {
    RtKv *kv;
    RtError e;
    CHECK(rt_kv_open(&kv, 8, 4, &e) == RT_OK, "open: %s", e.msg);
    RtKvSeq s = {0};
    CHECK(rt_kv_grow(kv, &s, 9) == 0, "grow to 9 positions");
    CHECK(s.n == 3, "9 positions in blocks of 4 take 3 blocks, got %lld", (long long)s.n);
    CHECK(rt_kv_used_blocks(kv) == 3 && rt_kv_free_blocks(kv) == 5, "used %lld free %lld", (long long)rt_kv_used_blocks(kv),
          (long long)rt_kv_free_blocks(kv));
    CHECK(rt_kv_grow(kv, &s, 12) == 0 && s.n == 3, "12 positions still 3 blocks");
    CHECK(rt_kv_grow(kv, &s, 33) == -1 && s.n == 3, "33 positions need 9 blocks of 8: refused, unchanged");
    CHECK(rt_kv_grow(kv, &s, 32) == 0 && s.n == 8, "32 positions take the whole pool");
    CHECK(rt_kv_free_blocks(kv) == 0, "none free");
    rt_kv_release(kv, &s);
    CHECK(rt_kv_free_blocks(kv) == 8 && rt_kv_used_blocks(kv) == 0, "all free after release");
    rt_kv_seq_free(&s);
    rt_kv_close(kv);
}

static void prefix_sharing(void) {
    RtKv *kv;
    RtError e;
    CHECK(rt_kv_open(&kv, 16, 4, &e) == RT_OK, "open");
    int32_t a[14], b[14];
    for (int i = 0; i < 14; i++) a[i] = b[i] = 100 + i;
    RtKvSeq s = {0}, t = {0}, u = {0};
    CHECK(rt_kv_match_prefix(kv, &s, a, 14, 13) == 0, "nothing cached yet");
    CHECK(rt_kv_grow(kv, &s, 14) == 0, "grow");
    rt_kv_commit(kv, &s, a, 14); /* blocks 0..2 full */
    CHECK(s.nhashed == 3, "3 full blocks keyed, got %lld", (long long)s.nhashed);
    /* the same prompt: 3 blocks shared, the same block numbers */
    CHECK(rt_kv_match_prefix(kv, &t, a, 14, 13) == 12, "a hit covers 12 positions");
    CHECK(t.n == 3 && memcmp(t.blocks, s.blocks, 3 * sizeof *t.blocks) == 0, "the same blocks");
    CHECK(rt_kv_used_blocks(kv) == 4, "shared blocks are counted once: %lld", (long long)rt_kv_used_blocks(kv));
    /* the last prompt position's block is never shared: with max_pos 12, block 3 would hold it */
    RtKvSeq w = {0};
    CHECK(rt_kv_match_prefix(kv, &w, a, 12, 11) == 8, "a 12-token prompt shares 2 blocks (its last is recomputed)");
    rt_kv_release(kv, &w);
    /* a token changed in block 1: only block 0 matches (the chain hash covers the prefix) */
    b[5] = 7;
    CHECK(rt_kv_match_prefix(kv, &u, b, 14, 13) == 4, "a changed token in block 1 stops the match after block 0");
    rt_kv_release(kv, &u);
    /* released blocks stay cached and are found again */
    rt_kv_release(kv, &s);
    rt_kv_release(kv, &t);
    CHECK(rt_kv_cached_blocks(kv) == 3 && rt_kv_used_blocks(kv) == 0, "3 cached, %lld used", (long long)rt_kv_used_blocks(kv));
    CHECK(rt_kv_match_prefix(kv, &t, a, 14, 13) == 12, "found again after release");
    CHECK(rt_kv_hits(kv) == 3 + 2 + 1 + 3, "hits counted: %lld", (long long)rt_kv_hits(kv));
    rt_kv_release(kv, &t);
    rt_kv_seq_free(&s), rt_kv_seq_free(&t), rt_kv_seq_free(&u), rt_kv_seq_free(&w);
    rt_kv_close(kv);
}

static void lru_eviction(void) {
    RtKv *kv;
    RtError e;
    CHECK(rt_kv_open(&kv, 4, 2, &e) == RT_OK, "open");
    int32_t p[4] = {1, 2, 3, 4}, q[4] = {5, 6, 7, 8};
    RtKvSeq s = {0};
    CHECK(rt_kv_grow(kv, &s, 4) == 0, "grow");
    rt_kv_commit(kv, &s, p, 4);
    rt_kv_release(kv, &s); /* p's 2 blocks cached */
    CHECK(rt_kv_grow(kv, &s, 4) == 0, "grow q");
    rt_kv_commit(kv, &s, q, 4);
    rt_kv_release(kv, &s); /* q's 2 blocks cached, more recently */
    CHECK(rt_kv_cached_blocks(kv) == 4, "4 cached");
    /* one new block evicts the least recently used: p's last block (released before p's first) */
    RtKvSeq n = {0};
    CHECK(rt_kv_grow(kv, &n, 1) == 0, "grow 1");
    RtKvSeq m = {0};
    CHECK(rt_kv_match_prefix(kv, &m, q, 4, 4) == 4, "q still fully cached");
    rt_kv_release(kv, &m);
    CHECK(rt_kv_match_prefix(kv, &m, p, 4, 4) == 2, "p lost its second block first, got %lld", (long long)m.n * 2);
    rt_kv_release(kv, &m), rt_kv_release(kv, &n);
    rt_kv_seq_free(&s), rt_kv_seq_free(&n), rt_kv_seq_free(&m);
    rt_kv_close(kv);
}

static void bad_sizes(void) {
    RtKv *kv;
    RtError e;
    CHECK(rt_kv_open(&kv, 0, 16, &e) == RT_ERR_ARG && kv == NULL, "0 blocks refused");
    CHECK(strstr(e.msg, "0 blocks") != NULL, "message: %s", e.msg);
}

int main(void) {
    RUN(grow_and_release);
    RUN(prefix_sharing);
    RUN(lru_eviction);
    RUN(bad_sizes);
    return unit_finish();
}
