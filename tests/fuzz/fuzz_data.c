/* fuzz_data.c - libFuzzer target for the runtime's token-shard reader (runtime/io/data.c): every
 * input is written to one temporary file, which is opened with rt_data_open as the only training
 * shard under a few fixed settings (seq 1 and seq 3; with and without a vocabulary, a shuffle and
 * a held-out tail), and up to 64 windows of each split are read with rt_data_next. The reader's
 * promises are held (else abort: a finding):
 *   - a shard that opens has at least one window, and each window read gives y = x shifted by one
 *     token, every id below the vocabulary (when one is set) and non-negative;
 *   - rt_data_tell / rt_data_seek round-trip, and the same windows come back after a seek;
 *   - a failure is RT_ERR_FORMAT, RT_ERR_ARG (a held-out tail larger than the data) or
 *     RT_ERR_NOMEM, with a one-line message that names the shard's file (or the data pattern).
 * Built by `make fuzz-build` with ASan and UBSan; run by tests/fuzz/run.sh with the corpus
 * tests/fuzz/corpus_data (llm.c shards with uint16 and uint32 tokens, raw uint16 files, and
 * damaged headers). A crash, a sanitizer report, an abort, a leak or a hang is a finding. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char shard_path[4096];

/* The shard's temporary file: one per process, in $TMPDIR, removed at exit. */
static void remove_shard(void) {
    unlink(shard_path);
    char *slash = strrchr(shard_path, '/');
    if (slash) {
        *slash = 0;
        rmdir(shard_path);
    }
}

static const char *shard_file(void) {
    if (shard_path[0]) return shard_path;
    const char *tmp = getenv("TMPDIR");
    char dir[4000];
    snprintf(dir, sizeof dir, "%s/mbt-fuzz-data.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) abort();
    snprintf(shard_path, sizeof shard_path, "%s/shard.bin", dir);
    atexit(remove_shard);
    return shard_path;
}

static void check_error(RtStatus st, const RtError *e) {
    if (st != RT_ERR_FORMAT && st != RT_ERR_ARG && st != RT_ERR_NOMEM) abort();
    if (!e->msg[0] || strchr(e->msg, '\n')) abort();
    if (!strstr(e->msg, shard_path)) abort();
}

/* Reads up to 64 windows of d, one at a time, checking each. */
static void read_windows(RtData *d, int64_t vocab) {
    int64_t T = rt_data_seq(d), n = rt_data_windows(d);
    if (n < 1 || T < 1) abort();
    int32_t *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)T * sizeof *y);
    int32_t *x2 = malloc((size_t)T * sizeof *x2), *y2 = malloc((size_t)T * sizeof *y2);
    if (!x || !y || !x2 || !y2) abort();
    RtError e;
    for (int64_t w = 0; w < n && w < 64; w++) {
        RtDataPos at = rt_data_tell(d);
        RtStatus st = rt_data_next(d, 1, x, y, &e);
        if (st != RT_OK) {
            check_error(st, &e);
            if (st == RT_ERR_ARG) abort();
            RtDataPos still = rt_data_tell(d); /* a failed read does not move the position */
            if (memcmp(&still, &at, sizeof at) != 0) abort();
            break;
        }
        for (int64_t i = 0; i < T; i++) {
            if (x[i] < 0 || y[i] < 0 || (vocab > 0 && (x[i] >= vocab || y[i] >= vocab))) abort();
            if (i + 1 < T && y[i] != x[i + 1]) abort();
        }
        if (w == 0 || w == n - 1) { /* the position restores exactly */
            if (rt_data_seek(d, &at, &e) != RT_OK) abort();
            if (rt_data_next(d, 1, x2, y2, &e) != RT_OK) abort();
            if (memcmp(x, x2, (size_t)T * sizeof *x) || memcmp(y, y2, (size_t)T * sizeof *y)) abort();
        }
    }
    free(x);
    free(y);
    free(x2);
    free(y2);
}

static void try_spec(const RtDataSpec *spec, RtSplit split) {
    RtData *d = NULL;
    RtError e;
    RtStatus st = rt_data_open(&d, spec, split, &e);
    if (st != RT_OK) {
        if (d) abort();
        check_error(st, &e);
        return;
    }
    if (!d || rt_data_nfiles(d) != 1 || rt_data_file_tokens(d, 0) < 0) abort();
    read_windows(d, spec->vocab);
    rt_data_close(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = shard_file();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) abort();
    for (size_t put = 0; put < size;) {
        ssize_t k = write(fd, data + put, size - put);
        if (k <= 0) abort();
        put += (size_t)k;
    }
    close(fd);
    static const struct {
        int64_t seq, vocab;
        int shuffle;
        int64_t val_windows;
    } settings[] = {{1, 0, 0, 0}, {3, 300, 1, 1}, {2, 50257, 0, 2}};
    for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
        RtDataSpec spec = {path, NULL, settings[k].seq, settings[k].vocab, settings[k].shuffle, 7, settings[k].val_windows};
        try_spec(&spec, RT_SPLIT_TRAIN);
        if (spec.val_windows > 0) try_spec(&spec, RT_SPLIT_VAL);
    }
    return 0;
}
