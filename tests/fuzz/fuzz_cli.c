/* fuzz_cli.c - libFuzzer target for the executable's command-line parser (runtime/cli/cli.c,
 * rt_cli_parse) against a fixed program descriptor (tests/runtime/bigram_program.c's mbt_program):
 * the input's bytes, split on NUL, are argv (argv[0] included; at most 64 arguments), each one a
 * malloc'd string of exactly its length. The parser's promises are held (else abort: a finding):
 *   - it returns RT_OK or RT_ERR_ARG (RT_ERR_NOMEM when out of memory), never exits;
 *   - a failure's message is one line, not empty, and not an internal error;
 *   - a success is help, train, eval or generate, with a prompt of at least one token below the
 *     program's vocabulary (help has none), a known device, and option values that are argv's
 *     own strings (or the program's defaults);
 *   - --help's text (to /dev/null) is printed for every program name.
 * Built by `make fuzz-build` with ASan and UBSan; run by tests/fuzz/run.sh with the corpus
 * tests/fuzz/corpus_cli. A crash, a sanitizer report, an abort, a leak or a hang is a finding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_exec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ARGS = 64 };

/* 1 when s is NULL, one of argv's strings (or a suffix of one, after '='), or the program's. */
static int from_argv(const char *s, char **argv, int argc, const char *dflt) {
    if (!s || s == dflt) return 1;
    for (int i = 0; i < argc; i++)
        if (s >= argv[i] && s <= argv[i] + strlen(argv[i])) return 1;
    return 0;
}

static void check_ok(const RtOptions *o, const RtProgram *p, char **argv, int argc) {
    if (o->cmd == RT_CMD_HELP) {
        if (o->prompt) abort();
        return;
    }
    if (o->cmd != RT_CMD_TRAIN && o->cmd != RT_CMD_EVAL && o->cmd != RT_CMD_GENERATE && o->cmd != RT_CMD_SERVE) abort();
    if (!o->prompt || o->nprompt < 1) abort();
    for (int64_t i = 0; i < o->nprompt; i++)
        if (o->prompt[i] < 0 || o->prompt[i] >= p->train.vocab) abort();
    if (strcmp(o->device, "auto") && strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) abort();
    if (o->steps < 0 || o->max_tokens < 0 || o->top_k < 0 || o->ckpt_every < 0 || o->ckpt_keep < 0) abort();
    if (!(o->temperature >= 0)) abort();
    if (o->threads < 0) abort();
    const char *own[] = {o->data,      o->log_path, o->init_weights, o->save_weights,
                         o->dump_step, o->weights,  o->resume,       o->resume_weights_only};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
        if (!from_argv(own[k], argv, argc, NULL)) abort();
    if (!from_argv(o->ckpt_dir, argv, argc, o->ckpt_dir_default)) abort();
    if (o->resume && (o->resume_weights_only || o->init_weights || o->dump_step)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    size_t at = 0;
    while (argc < MAX_ARGS && (at < size || argc == 0)) {
        size_t end = at;
        while (end < size && data[end]) end++;
        argv[argc] = malloc(end - at + 1);
        if (!argv[argc]) abort();
        memcpy(argv[argc], data + at, end - at);
        argv[argc][end - at] = 0;
        argc++;
        at = end + 1;
    }
    argv[argc] = NULL;
    RtOptions o;
    RtError e;
    rt_error_clear(&e);
    RtStatus st = rt_cli_parse(&o, &mbt_program, argc, argv, &e);
    if (st == RT_OK) {
        check_ok(&o, &mbt_program, argv, argc);
        if (o.cmd == RT_CMD_HELP) {
            FILE *null = fopen("/dev/null", "w");
            if (!null) abort();
            rt_cli_help(null, &mbt_program, o.prog);
            fclose(null);
        }
    } else {
        if (st != RT_ERR_ARG && st != RT_ERR_NOMEM) abort();
        if (!e.msg[0] || strchr(e.msg, '\n') || strncmp(e.msg, "internal error", 14) == 0) abort();
    }
    rt_options_free(&o);
    if (o.prompt || o.nprompt) abort();
    for (int i = 0; i < argc; i++) free(argv[i]);
    return 0;
}
