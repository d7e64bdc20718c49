/* test_rt_data.c - unit tests of runtime/data.c: token shards in both formats, batches,
 * sequential and shuffled order, position save/restore, held-out splits, and one case per bad
 * file with the exact error text.
 *
 * Build: make build/tests/test_rt_data (links build/libmbtrt.a). Prints `PASS name` or
 * `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure.
 *
 * Each case writes small shards into its own temporary directory (removed afterwards). Shards
 * hold consecutive token ids, so a window is identified by its first token. */
#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>

#include "rt.h"
#include "unit.h"
#include "scratch.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static void dir_make(void) { dir_make_tagged("data"); }

/* A shard of tokens first, first+1, ..., first+n-1. */
static void shard(const char *name, RtShardFormat fmt, uint32_t first, int64_t n) {
    uint32_t *t = malloc((size_t)(n ? n : 1) * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = first + (uint32_t)i;
    RtError e;
    if (rt_shard_write(at(name), fmt, t, n, &e) != RT_OK) CHECK(0, "writing %s: %s", name, e.msg);
    free(t);
}

static void bytes(const char *name, const void *p, size_t n) {
    FILE *f = fopen(at(name), "wb");
    CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "writing %s", name);
}

/* An llm.c header with the given words. */
static void header(unsigned char *h, uint32_t magic, uint32_t version, uint32_t count) {
    memset(h, 0, RT_LLMC_HEADER_BYTES);
    uint32_t w[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) h[4 * i + k] = (unsigned char)(w[i] >> (8 * k));
}

static RtDataSpec spec(const char *pattern, int64_t T) {
    return (RtDataSpec){.pattern = pattern, .seq = T, .vocab = 1 << 20, .shuffle = 0, .seed = 1337};
}

static RtData *open_ok(const RtDataSpec *s, RtSplit split) {
    RtData *d = NULL;
    RtError e;
    RtStatus st = rt_data_open(&d, s, split, &e);
    CHECK(st == RT_OK, "open %s: %s", s->pattern, e.msg);
    return d;
}

/* The first token of each of the next `n` windows (batches of B). */
static void starts(RtData *d, int64_t B, int n, int32_t *out) {
    int64_t T = rt_data_seq(d);
    int32_t *x = malloc((size_t)(B * T) * sizeof *x), *y = malloc((size_t)(B * T) * sizeof *y);
    for (int k = 0; k < n; k += (int)B) {
        RtError e;
        RtStatus st = rt_data_next(d, B, x, y, &e);
        CHECK(st == RT_OK, "next: %s", e.msg);
        if (st != RT_OK) break;
        for (int64_t b = 0; b < B && k + b < n; b++) {
            out[k + b] = x[b * T];
            /* consecutive tokens within a window, and y is x shifted by one */
            for (int64_t i = 0; i < T; i++) {
                if (x[b * T + i] != x[b * T] + i || y[b * T + i] != x[b * T] + i + 1) {
                    CHECK(0, "window %lld is not consecutive tokens with y = x + 1", (long long)(k + b));
                    i = T;
                }
            }
        }
    }
    free(x);
    free(y);
}

static void open_err(const RtDataSpec *s, RtSplit split, RtStatus want, const char *msg) {
    RtData *d = NULL;
    RtError e;
    RtStatus st = rt_data_open(&d, s, split, &e);
    CHECK(st == want, "open %s: status %s, expected %s (%s)", s->pattern, rt_status_name(st), rt_status_name(want),
          st == RT_OK ? "opened" : e.msg);
    if (st != RT_OK) CHECK_STR(e.msg, msg, "error message");
    CHECK(st != RT_OK || d != NULL, "no source");
    rt_data_close(d);
}

/* ---- order ------------------------------------------------------------------------------------- */

static void sequential_batches(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 101);    /* windows of T=10: (101-1)/10 = 10, starts 0..90 */
    shard("b.bin", RT_SHARD_LLMC, 1000, 105); /* 10 windows (the last 4 tokens are never used) */
    RtDataSpec s = spec(at("*.bin"), 10);
    RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
    if (d) {
        CHECK(rt_data_windows(d) == 20 && rt_data_nfiles(d) == 2, "windows %lld files %lld", (long long)rt_data_windows(d),
              (long long)rt_data_nfiles(d));
        CHECK(rt_data_file_tokens(d, 1) == 105, "file 1 tokens");
        CHECK_STR(rt_data_file(d, 0), at("a.bin"), "files are sorted");
        int32_t got[24];
        starts(d, 4, 24, got);
        for (int k = 0; k < 24; k++) {
            int w = k % 20; /* the 21st window starts epoch 1 again at a.bin */
            int32_t want = w < 10 ? 10 * w : 1000 + 10 * (w - 10);
            CHECK(got[k] == want, "window %d starts at %d, expected %d", k, got[k], want);
        }
        RtDataPos p = rt_data_tell(d);
        CHECK(p.epoch == 1 && p.shard == 0 && p.window == 4, "position %llu/%llu/%llu after 24 windows",
              (unsigned long long)p.epoch, (unsigned long long)p.shard, (unsigned long long)p.window);
    }
    rt_data_close(d);
    dir_remove();
}

static void formats_agree(void) {
    dir_make();
    mkdir(at("l"), 0755);
    mkdir(at("r"), 0755);
    mkdir(at("u"), 0755);
    shard("l/x.bin", RT_SHARD_LLMC, 7, 333);
    shard("r/x.bin", RT_SHARD_RAW, 7, 333);
    shard("u/x.bin", RT_SHARD_LLMC_U32, 7, 333);
    struct stat st;
    CHECK(stat(at("l/x.bin"), &st) == 0 && st.st_size == 1024 + 666, "llm.c shard size %lld", (long long)st.st_size);
    CHECK(stat(at("r/x.bin"), &st) == 0 && st.st_size == 666, "raw shard size %lld", (long long)st.st_size);
    CHECK(stat(at("u/x.bin"), &st) == 0 && st.st_size == 1024 + 1332, "u32 shard size %lld", (long long)st.st_size);
    int32_t a[33], b[33], c[33];
    const char *pats[3] = {at("l/*.bin"), at("r/*.bin"), at("u/x.bin")};
    int32_t *outs[3] = {a, b, c};
    for (int k = 0; k < 3; k++) {
        RtDataSpec s = spec(pats[k], 10);
        RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
        if (d) {
            CHECK(rt_data_file_tokens(d, 0) == 333, "format %d: %lld tokens", k, (long long)rt_data_file_tokens(d, 0));
            starts(d, 3, 33, outs[k]);
        }
        rt_data_close(d);
    }
    CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(a, c, sizeof a) == 0, "the three formats give different batches");
    CHECK(a[0] == 7 && a[1] == 17 && a[32] == 327, "wrong windows: %d %d %d", a[0], a[1], a[32]);
    dir_remove();
}

static void shuffled_is_a_permutation(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 401);       /* 100 windows of T=4 */
    shard("b.bin", RT_SHARD_RAW, 10000, 161);    /* 40 */
    shard("c.bin", RT_SHARD_LLMC, 20000, 4 + 1); /* 1 */
    RtDataSpec s = spec(at("*.bin"), 4);
    s.shuffle = 1;
    RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
    if (d) {
        int W = (int)rt_data_windows(d);
        CHECK(W == 141, "%d windows", W);
        int32_t e0[141], e1[141];
        starts(d, 3, W, e0);
        starts(d, 3, W, e1);
        int seen[141] = {0}, in_order = 0, switches = 0;
        for (int k = 0; k < W; k++) {
            int32_t v = e0[k];
            int idx = v >= 20000 ? 140 : v >= 10000 ? 100 + (v - 10000) / 4 : v / 4;
            CHECK(idx >= 0 && idx < 141 && v % 4 == 0, "window start %d is not a window", v);
            if (idx >= 0 && idx < 141) seen[idx]++;
            in_order += k > 0 && e0[k] == e0[k - 1] + 4;
            switches += k > 0 && e0[k] / 10000 != e0[k - 1] / 10000;
        }
        for (int i = 0; i < W; i++) CHECK(seen[i] == 1, "window %d visited %d times in epoch 0", i, seen[i]);
        CHECK(in_order < 20, "%d of 141 consecutive windows in file order: not shuffled", in_order);
        CHECK(switches == 2, "epoch 0 moved between shards %d times; each shard is read in one go", switches);
        CHECK(memcmp(e0, e1, sizeof e0) != 0, "epoch 1 repeats epoch 0's order");
        int seen1[141] = {0};
        for (int k = 0; k < W; k++) {
            int32_t v = e1[k];
            int idx = v >= 20000 ? 140 : v >= 10000 ? 100 + (v - 10000) / 4 : v / 4;
            if (idx >= 0 && idx < 141) seen1[idx]++;
        }
        for (int i = 0; i < W; i++) CHECK(seen1[i] == 1, "window %d visited %d times in epoch 1", i, seen1[i]);
    }
    rt_data_close(d);
    dir_remove();
}

static void same_seed_same_order(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 1001);
    shard("b.bin", RT_SHARD_LLMC, 5000, 501);
    RtDataSpec s = spec(at("*.bin"), 8);
    s.shuffle = 1;
    s.seed = 42;
    RtData *d1 = open_ok(&s, RT_SPLIT_TRAIN), *d2 = open_ok(&s, RT_SPLIT_TRAIN);
    s.seed = 43;
    RtData *d3 = open_ok(&s, RT_SPLIT_TRAIN);
    if (d1 && d2 && d3) {
        int n = 3 * 187; /* three epochs of 125 + 62 windows */
        int32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
        starts(d1, 1, n, a);
        starts(d2, 11, n, b); /* another batch size: the window sequence is the same */
        starts(d3, 1, n, c);
        CHECK(memcmp(a, b, n * sizeof *a) == 0, "the same seed gives another order");
        CHECK(memcmp(a, c, n * sizeof *a) != 0, "another seed gives the same order");
        free(a);
        free(b);
        free(c);
    }
    rt_data_close(d1);
    rt_data_close(d2);
    rt_data_close(d3);
    dir_remove();
}

static void position_save_restore(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 1001);
    shard("b.bin", RT_SHARD_RAW, 3000, 777);
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        RtDataSpec s = spec(at("*.bin"), 16);
        s.shuffle = shuffle;
        RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
        RtData *r = open_ok(&s, RT_SPLIT_TRAIN);
        if (!d || !r) break;
        int32_t skip[150], want[40], got[40];
        starts(d, 5, 150, skip); /* into epoch 1 (110 windows an epoch) */
        RtDataPos p = rt_data_tell(d);
        starts(d, 4, 40, want);
        RtError e;
        CHECK(rt_data_seek(r, &p, &e) == RT_OK, "seek: %s", e.msg);
        starts(r, 4, 40, got);
        CHECK(memcmp(want, got, sizeof want) == 0, "shuffle=%d: the restored source continues differently", shuffle);
        /* Rewind goes back to the very first window. */
        rt_data_rewind(r);
        int32_t first[5];
        starts(r, 5, 5, first);
        CHECK(memcmp(first, skip, sizeof first) == 0, "shuffle=%d: rewind does not restart epoch 0", shuffle);
        rt_data_close(d);
        rt_data_close(r);
    }
    /* A position from other data or settings is refused, with the reason. */
    RtDataSpec s = spec(at("*.bin"), 16);
    RtData *a = open_ok(&s, RT_SPLIT_TRAIN);
    s.seq = 8;
    RtData *b = open_ok(&s, RT_SPLIT_TRAIN);
    if (a && b) {
        RtDataPos p = rt_data_tell(a);
        RtError e;
        CHECK(rt_data_seek(b, &p, &e) == RT_ERR_ARG, "a foreign position was accepted");
        char want[256];
        snprintf(want, sizeof want,
                 "cannot restore the data position: it was saved from other data or settings (fingerprint %016llx, these "
                 "data have %016llx)",
                 (unsigned long long)p.fingerprint, (unsigned long long)rt_data_tell(b).fingerprint);
        CHECK_STR(e.msg, want, "message");
        p.window = 1000;
        CHECK(rt_data_seek(a, &p, &e) == RT_ERR_ARG, "an out-of-range position was accepted");
        CHECK_STR(e.msg, "cannot restore the data position: epoch 0, shard 0, window 1000 is outside the data", "message");
    }
    rt_data_close(a);
    rt_data_close(b);
    dir_remove();
}

/* ---- held-out data ----------------------------------------------------------------------------- */

static void holdout_tail(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 81);    /* 10 windows of T=8 */
    shard("b.bin", RT_SHARD_LLMC, 1000, 41); /* 5 */
    RtDataSpec s = spec(at("*.bin"), 8);
    s.val_windows = 7; /* all 5 of b.bin and the last 2 of a.bin */
    RtData *tr = open_ok(&s, RT_SPLIT_TRAIN), *va = open_ok(&s, RT_SPLIT_VAL);
    if (tr && va) {
        CHECK(rt_data_windows(tr) == 8 && rt_data_windows(va) == 7, "train %lld val %lld windows", (long long)rt_data_windows(tr),
              (long long)rt_data_windows(va));
        int32_t t[8], v[9];
        starts(tr, 2, 8, t);
        starts(va, 3, 9, v);
        for (int k = 0; k < 8; k++) CHECK(t[k] == 8 * k, "train window %d starts at %d", k, t[k]);
        int32_t want[9] = {64, 72, 1000, 1008, 1016, 1024, 1032, 64, 72}; /* then val's epoch 1 */
        for (int k = 0; k < 9; k++) CHECK(v[k] == want[k], "val window %d starts at %d, expected %d", k, v[k], want[k]);
    }
    rt_data_close(tr);
    rt_data_close(va);
    /* Shuffled training never draws a held-out window; the val split stays in order. */
    s.shuffle = 1;
    tr = open_ok(&s, RT_SPLIT_TRAIN);
    va = open_ok(&s, RT_SPLIT_VAL);
    if (tr && va) {
        int32_t t[24], v[7];
        starts(tr, 4, 24, t);
        for (int k = 0; k < 24; k++) CHECK(t[k] < 64, "shuffled training drew held-out window %d", t[k]);
        starts(va, 7, 7, v);
        CHECK(v[0] == 64 && v[2] == 1000 && v[6] == 1032, "val split is shuffled");
    }
    rt_data_close(tr);
    rt_data_close(va);
    dir_remove();
}

static void val_glob(void) {
    dir_make();
    shard("train.bin", RT_SHARD_LLMC, 0, 81);
    shard("val.bin", RT_SHARD_LLMC, 500, 41);
    RtDataSpec s = spec(at("train*.bin"), 8);
    s.val_pattern = at("val*.bin");
    s.val_windows = 3; /* ignored: there is a val glob */
    RtData *tr = open_ok(&s, RT_SPLIT_TRAIN), *va = open_ok(&s, RT_SPLIT_VAL);
    if (tr && va) {
        CHECK(rt_data_windows(tr) == 10 && rt_data_windows(va) == 5, "train %lld val %lld", (long long)rt_data_windows(tr),
              (long long)rt_data_windows(va));
        int32_t v[5];
        starts(va, 5, 5, v);
        CHECK(v[0] == 500 && v[4] == 532, "val windows %d..%d", v[0], v[4]);
    }
    rt_data_close(tr);
    rt_data_close(va);
    dir_remove();
}

/* ---- bad files --------------------------------------------------------------------------------- */

static void bad_missing(void) {
    dir_make();
    char want[600];
    RtDataSpec s = spec(at("*.bin"), 8);
    snprintf(want, sizeof want, "no data files match '%s/*.bin'", dir);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_NOTFOUND, want);
    s = spec(at("nope.bin"), 8);
    snprintf(want, sizeof want, "cannot open data shard '%s/nope.bin': No such file or directory", dir);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_IO, want);
    s = spec(at("a.bin"), 8);
    s.val_pattern = at("val_*.bin");
    shard("a.bin", RT_SHARD_LLMC, 0, 100);
    snprintf(want, sizeof want, "no data files match '%s/val_*.bin'", dir);
    open_err(&s, RT_SPLIT_VAL, RT_ERR_NOTFOUND, want);
    s.val_pattern = NULL;
    open_err(&s, RT_SPLIT_VAL, RT_ERR_NOTFOUND,
             "data: no held-out data: give a val glob, or hold out windows at the end of the training data");
    dir_remove();
}

static void bad_empty(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 100);
    bytes("b.bin", "", 0);
    char want[600];
    snprintf(want, sizeof want, "data shard '%s/b.bin' is empty", dir);
    RtDataSpec s = spec(at("*.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    dir_remove();
}

static void bad_truncated(void) {
    dir_make();
    unsigned char buf[1024 + 200];
    header(buf, RT_LLMC_MAGIC, 1, 100);
    memset(buf + 1024, 1, 200);
    bytes("short.bin", buf, 1024 + 150); /* the header says 100 tokens = 200 bytes */
    char want[600];
    snprintf(want, sizeof want,
             "data shard '%s/short.bin' is truncated: its header says 100 tokens (200 bytes after the 1024-byte header) "
             "but the file has 1174 bytes",
             dir);
    RtDataSpec s = spec(at("short.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    bytes("long.bin", buf, 1024 + 200);
    header(buf, RT_LLMC_MAGIC, 1, 90);
    bytes("long.bin", buf, 1024 + 200);
    snprintf(want, sizeof want, "data shard '%s/long.bin' has 20 bytes more than the 90 tokens its header declares", dir);
    s = spec(at("long.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    bytes("hdr.bin", buf, 12); /* the magic, then nothing */
    snprintf(want, sizeof want,
             "data shard '%s/hdr.bin' is truncated: it starts with the llm.c magic number 20240520 but has only 12 bytes, "
             "less than the 1024-byte header",
             dir);
    s = spec(at("hdr.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    dir_remove();
}

static void bad_magic_and_version(void) {
    dir_make();
    unsigned char buf[1024 + 200];
    memset(buf + 1024, 1, 200);
    header(buf, RT_LLMC_MAGIC + 1, 1, 100);
    bytes("magic.bin", buf, sizeof buf);
    char want[700];
    snprintf(want, sizeof want,
             "data shard '%s/magic.bin' has a bad magic number 20240521 in an llm.c header (version 1, 100 tokens, "
             "matching the file's size); llm.c shards start with 20240520 (uint16 tokens) or 20240801 (uint32 tokens)",
             dir);
    RtDataSpec s = spec(at("magic.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    header(buf, RT_LLMC_MAGIC, 2, 100);
    bytes("version.bin", buf, sizeof buf);
    snprintf(want, sizeof want, "data shard '%s/version.bin': unsupported llm.c shard version 2 (expected 1)", dir);
    s = spec(at("version.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    /* big-endian: the magic's bytes reversed */
    header(buf, __builtin_bswap32(RT_LLMC_MAGIC), 1, 100);
    bytes("swapped.bin", buf, sizeof buf);
    snprintf(want, sizeof want, "data shard '%s/swapped.bin' starts with a byte-swapped llm.c magic number (written big-endian?)",
             dir);
    s = spec(at("swapped.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    /* no magic and an odd size: not a raw uint16 file either */
    bytes("odd.bin", buf + 1024, 33);
    snprintf(want, sizeof want,
             "data shard '%s/odd.bin' has an odd number of bytes (33): a file without an llm.c header holds uint16 tokens", dir);
    s = spec(at("odd.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    dir_remove();
}

static void bad_token(void) {
    dir_make();
    uint32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = (uint32_t)(i % 60);
    t[23] = 70;
    RtError e;
    CHECK(rt_shard_write(at("a.bin"), RT_SHARD_LLMC, t, 100, &e) == RT_OK, "%s", e.msg);
    RtDataSpec s = spec(at("a.bin"), 10);
    s.vocab = 64;
    RtData *d = open_ok(&s, RT_SPLIT_TRAIN); /* checked when read, not when opened */
    if (d) {
        int32_t x[20], y[20];
        CHECK(rt_data_next(d, 2, x, y, &e) == RT_OK, "first batch: %s", e.msg); /* tokens 0..20 */
        RtDataPos before = rt_data_tell(d);
        CHECK(rt_data_next(d, 2, x, y, &e) == RT_ERR_FORMAT, "token 70 passed a vocab of 64");
        char want[600];
        snprintf(want, sizeof want,
                 "data shard '%s/a.bin': token id 70 at token 23 (byte offset 1070) is not below the vocabulary size 64", dir);
        CHECK_STR(e.msg, want, "message");
        RtDataPos after = rt_data_tell(d);
        CHECK(after.window == before.window && after.shard == before.shard, "a failed batch moved the position");
    }
    rt_data_close(d);
    dir_remove();
}

static void bad_other(void) {
    dir_make();
    mkdir(at("sub.bin"), 0755);
    shard("a.bin", RT_SHARD_LLMC, 0, 100);
    char want[600];
    snprintf(want, sizeof want, "data shard '%s/sub.bin' is a directory, not a regular file", dir);
    RtDataSpec s = spec(at("*.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    s = spec(at("a.bin"), 100); /* 100 tokens cannot hold a window of 101 */
    snprintf(want, sizeof want, "data: no file matching '%s/a.bin' holds a window of 101 tokens (seq 100 + 1)", dir);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    s = spec(at("a.bin"), 9); /* 11 windows */
    s.val_windows = 11;
    snprintf(want, sizeof want,
             "data: cannot hold out 11 windows for evaluation: the files matching '%s/a.bin' hold only 11 windows of 10 tokens",
             dir);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_ARG, want);
    s = spec(at("a.bin"), 0);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_ARG, "data: seq must be at least 1, not 0");
    s = spec(at("a.bin"), 9);
    RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
    if (d) {
        int32_t x[9], y[9];
        RtError e;
        CHECK(rt_data_next(d, 0, x, y, &e) == RT_ERR_ARG, "B = 0 accepted");
        CHECK_STR(e.msg, "data: a batch needs at least one sequence, not 0", "message");
    }
    rt_data_close(d);
    /* writing: a token too wide for uint16 */
    uint32_t big = 70000;
    RtError e;
    CHECK(rt_shard_write(at("w.bin"), RT_SHARD_LLMC, &big, 1, &e) == RT_ERR_ARG, "70000 written as uint16");
    snprintf(want, sizeof want, "cannot write data shard '%s/w.bin': token 0 is 70000, which does not fit uint16", dir);
    CHECK_STR(e.msg, want, "message");
    CHECK(access(at("w.bin"), F_OK) != 0, "a failed write left a file");
    dir_remove();
}

/* issue 19: a shard truncated while training reads it was a SIGBUS (shards were mapped); now the
 * read that finds it short is an error, and so is reopening a shard whose size has changed. */
static void shard_truncated_while_reading(void) {
    dir_make();
    shard("a.bin", RT_SHARD_LLMC, 0, 101); /* 10 windows of T=10 */
    shard("b.bin", RT_SHARD_LLMC, 1000, 101);
    RtDataSpec s = spec(at("*.bin"), 10);
    RtData *d = open_ok(&s, RT_SPLIT_TRAIN);
    if (d) {
        int32_t x[20], y[20], got[2];
        starts(d, 2, 2, got); /* windows 0 and 1 of a.bin: a.bin is open */
        CHECK(truncate(at("a.bin"), RT_LLMC_HEADER_BYTES + 2 * 30) == 0, "truncate");
        RtError e;
        CHECK(rt_data_next(d, 1, x, y, &e) == RT_ERR_IO, "a truncated shard read");
        char want[600];
        snprintf(want, sizeof want,
                 "data shard '%s/a.bin' was truncated while training read it: it had 1226 bytes at the start, and now ends "
                 "before the 22 bytes of the window at byte 1064",
                 dir);
        CHECK_STR(e.msg, want, "message");
        RtDataPos at_b = {0, 1, 0, rt_data_tell(d).fingerprint}; /* b.bin, then a.bin again (epoch 1) */
        CHECK(rt_data_seek(d, &at_b, &e) == RT_OK, "seek: %s", e.msg);
        int32_t xb[100], yb[100];
        CHECK(rt_data_next(d, 10, xb, yb, &e) == RT_OK, "b.bin: %s", e.msg);
        CHECK(rt_data_next(d, 1, x, y, &e) == RT_ERR_IO, "a shrunk shard reopened");
        snprintf(want, sizeof want,
                 "data shard '%s/a.bin' changed size while training read it: 1084 bytes, not the 1226 it had at the start", dir);
        CHECK_STR(e.msg, want, "message");
    }
    rt_data_close(d);
    dir_remove();
}

/* issue 19: --data, eval --data or generate --weights naming a FIFO blocked forever in open(). */
static void fifo_refused(void) {
    dir_make();
    CHECK(mkfifo(at("f.bin"), 0644) == 0, "mkfifo");
    char want[600];
    snprintf(want, sizeof want, "data shard '%s/f.bin' is a FIFO (named pipe), not a regular file", dir);
    RtDataSpec s = spec(at("f.bin"), 8);
    open_err(&s, RT_SPLIT_TRAIN, RT_ERR_FORMAT, want);
    RtStFile *f = NULL;
    RtError e;
    CHECK(rt_st_open(&f, at("f.bin"), &e) == RT_ERR_FORMAT, "a FIFO opened as safetensors");
    snprintf(want, sizeof want, "safetensors file '%s/f.bin' is a FIFO (named pipe), not a regular file", dir);
    CHECK_STR(e.msg, want, "message");
    dir_remove();
}

int main(void) {
    RUN(sequential_batches);
    RUN(formats_agree);
    RUN(shuffled_is_a_permutation);
    RUN(same_seed_same_order);
    RUN(position_save_restore);
    RUN(holdout_tail);
    RUN(val_glob);
    RUN(bad_missing);
    RUN(bad_empty);
    RUN(bad_truncated);
    RUN(bad_magic_and_version);
    RUN(bad_token);
    RUN(bad_other);
    RUN(shard_truncated_while_reading);
    RUN(fifo_refused);
    return unit_finish();
}
