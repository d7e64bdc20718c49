/* fuzz_state.c - libFuzzer target for the reader of a checkpoint's state.json (runtime/io/
 * checkpoint.c, rt_ckpt_load) against a fixed program descriptor (tests/runtime/bigram_program.c's
 * mbt_program). Once per process, the checkpoint writer itself writes a real checkpoint of that
 * program (parameters and optimizer state of fixed values, trained on a small shard) into a
 * temporary directory; then every input replaces that checkpoint's state.json and the checkpoint
 * is loaded, in full and weights-only, and its data checked against the shard (rt_ckpt_check_data).
 *
 * state.json checksums itself (state_xxh3_128), which a fuzzer's change would fail at once; so
 * that the checks behind it are reached, an input that has the key followed by 32 characters has
 * them replaced by the right checksum first - except when the input's first byte is '!', which
 * keeps (and strips) it, so the checksum's own check is fuzzed too.
 *
 * The reader's promises are held (else abort: a finding):
 *   - a failure is RT_ERR_FORMAT, RT_ERR_ARG, RT_ERR_IO or RT_ERR_NOMEM with a one-line message;
 *     *info is then empty;
 *   - a success gives a step >= 0 and every training file's entry (path, 32-digit sample checksum);
 *     rt_ckpt_check_data then answers RT_OK or RT_ERR_ARG, and rt_ckpt_info_free frees it all.
 * Built by `make fuzz-build` with ASan and UBSan; run by tests/fuzz/run.sh with the corpus
 * tests/fuzz/corpus_state. MBT_FUZZ_STATE_SEED=PATH writes the writer's own state.json to PATH
 * (the corpus's state_ok.json); MBT_FUZZ_VERBOSE=1 prints each load's message. A crash, a sanitizer report, an abort, a leak or a hang is a finding. */
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_exec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SELF_KEY "\"state_xxh3_128\": \""

static char root[4096], ckpt[4200], state_path[4300];
static RtData *train;
static float *params, *state;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void cleanup(void) {
    rt_data_close(train);
    free(params);
    free(state);
    if (root[0]) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void die(const char *what, const RtError *e) {
    fprintf(stderr, "fuzz_state: %s: %s\n", what, e ? e->msg : "");
    abort();
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) die("cannot write the state", NULL);
}

/* The checkpoint every input is read into: ROOT/ckpt/step-00000003, written by rt_ckpt_save. */
static void setup(void) {
    const RtProgram *p = &mbt_program;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/mbt-fuzz-state.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) die("cannot make a temporary directory", NULL);
    atexit(cleanup);
    char shard[4200];
    snprintf(shard, sizeof shard, "%s/shard.bin", root);
    uint32_t tokens[600];
    for (int i = 0; i < 600; i++) tokens[i] = (uint32_t)(i * 7 % 64);
    RtError e;
    if (rt_shard_write(shard, RT_SHARD_LLMC, tokens, 600, &e) != RT_OK) die("cannot write the shard", &e);
    RtDataSpec spec = {shard, NULL, p->train.seq, p->train.vocab, 1, 1, 0};
    if (rt_data_open(&train, &spec, RT_SPLIT_TRAIN, &e) != RT_OK) die("cannot open the shard", &e);
    params = calloc((size_t)p->param_floats, sizeof *params);
    state = calloc((size_t)(p->state_floats > 0 ? p->state_floats : 1), sizeof *state);
    if (!params || !state) die("out of memory", NULL);
    for (int64_t i = 0; i < p->param_floats; i++) params[i] = (float)(i % 13) * 0.125f;
    for (int64_t i = 0; i < p->state_floats; i++) state[i] = (float)(i % 7) * 0.5f;
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", root);
    RtCkptWriter *w = NULL;
    RtPool *pool = NULL;
    if (rt_pool_create(&pool, 1, &e) != RT_OK) die("no pool", &e);
    if (rt_ckpt_writer_open(&w, p, ckpt, 0, 0, train, -1, &e) != RT_OK) die("cannot open the writer", &e);
    RtCkptInfo info = {.step = 3,
                       .seed = 1,
                       .data = rt_data_tell(train),
                       .loss = 2.5,
                       .lr = 0.01,
                       .global = p->train.global,
                       .accum = p->train.accum,
                       .device = "cpu"};
    double waited;
    if (rt_ckpt_save(w, pool, params, state, &info, &waited, &e) != RT_OK) die("cannot save", &e);
    RtCkptDone done;
    while (rt_ckpt_poll(w, 1, &done))
        if (done.status != RT_OK) die("the checkpoint was not written", &done.err);
    rt_ckpt_writer_close(w);
    rt_pool_destroy(pool);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/step-00000003", root);
    snprintf(state_path, sizeof state_path, "%s/state.json", ckpt);
    const char *seed = getenv("MBT_FUZZ_STATE_SEED");
    if (seed && *seed) {
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", state_path, seed);
        if (system(cmd) != 0) die("cannot copy the seed", NULL);
    }
}

/* Puts the right state_xxh3_128 into the input's copy (the digits read as zeros, as written). */
static void fix_checksum(char *text, size_t n) {
    size_t klen = strlen(SELF_KEY);
    char *at = memmem(text, n, SELF_KEY, klen);
    if (!at || (size_t)(at - text) + klen + 32 > n) return;
    char *digits = at + klen;
    memset(digits, '0', 32);
    char sum[RT_CHECKSUM_CHARS];
    rt_checksum(text, n, sum);
    memcpy(digits, sum, 32);
}

static void check_error(RtStatus st, const RtError *e, const RtCkptInfo *info) {
    if (st != RT_ERR_FORMAT && st != RT_ERR_ARG && st != RT_ERR_IO && st != RT_ERR_NOMEM) die("a wrong status", e);
    if (!e->msg[0] || strchr(e->msg, '\n')) die("a bad message", e);
    if (info->ndata || info->data_files) die("info is not empty after a failure", e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!root[0]) setup();
    int keep = size > 0 && data[0] == '!';
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data + keep, size - keep);
    if (!keep) fix_checksum(text, size);
    write_file(state_path, text, size - keep);
    free(text);
    const RtProgram *p = &mbt_program;
    for (int weights_only = 0; weights_only < 2; weights_only++) {
        RtCkptInfo info;
        RtError e;
        rt_error_clear(&e);
        RtStatus st = rt_ckpt_load(p, ckpt, weights_only, params, weights_only ? NULL : state, &info, &e);
        if (getenv("MBT_FUZZ_VERBOSE")) fprintf(stderr, "load%s: %s\n", weights_only ? " (weights only)" : "", e.msg);
        if (st != RT_OK) {
            check_error(st, &e, &info);
            continue;
        }
        if (weights_only) {
            if (info.ndata || info.data_files) die("weights only, but a data list", NULL);
            continue;
        }
        if (info.step < 0 || info.ndata < 0 || (info.ndata > 0 && !info.data_files)) die("a bad info", NULL);
        for (int64_t i = 0; i < info.ndata; i++)
            if (!info.data_files[i].path || strlen(info.data_files[i].sample) != 32) die("a bad data entry", NULL);
        st = rt_ckpt_check_data(&info, ckpt, train, &e);
        if (st != RT_OK && st != RT_ERR_ARG) die("check_data's status", &e);
        if (st != RT_OK && (!e.msg[0] || strchr(e.msg, '\n'))) die("check_data's message", &e);
        rt_ckpt_info_free(&info);
    }
    return 0;
}
