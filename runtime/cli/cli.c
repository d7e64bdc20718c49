/* cli.c - the command line of every executable mbtc builds (see rt_exec.h; docs/runtime.md,
 * "The executable's command line"):
 *
 *   PROG train [NAME] [--steps N] [--device auto|cpu|cuda] [--seed S] [--data GLOB] [--log FILE.jsonl]
 *              [--init-weights F.safetensors] [--save-weights F.safetensors] [--save-adapter DIR]
 *              [--threads N]
 *   PROG eval [NAME] [--weights F] [--data GLOB] [--steps N] [--seed S] [--device D] [--threads N]
 *   PROG generate [--weights F] [--prompt-tokens 1,2,3] [--max-tokens N] [--temperature T]
 *                 [--top-k K] [--top-p P] [--seed S] [--device D] [--threads N] [--print-logits]
 *                 [--no-cache] [--prefill-chunk N]
 *   PROG serve [--weights F] [--host H] [--port P] [--kv-blocks N] [--tokenizer F] [--batch-tokens N]
 *              [--prefill-chunk N] [--batch-seqs N] [sampling flags] (runtime/serve/; docs/serve.md)
 *   PROG info                      (the memory plan: info.c; rt_main dispatches it)
 *   PROG --help
 *
 * Pipeline position: the first thing rt_main does. Flags override the program's settings, which
 * are the defaults (and --help prints them as such). A flag is `--flag value` or `--flag=value`;
 * a repeated flag takes its last value. A switch (--print-logits) takes no value. Every mistake is one message, returned in an RtError for
 * rt_main to print as `PROG: message` with exit status 1. The device the options ask for
 * (rt_device_want) and the `device:` line every command prints (rt_print_device) are here too. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_exec.h"

/* ---- the flags ---------------------------------------------------------------------------------- */

enum { RT_IN_TRAIN = 1, RT_IN_EVAL = 2, RT_IN_GENERATE = 4, RT_IN_SERVE = 8, RT_IN_ALL = 15 };

typedef enum RtFlagId {
    RT_F_STEPS,
    RT_F_DEVICE,
    RT_F_SEED,
    RT_F_DATA,
    RT_F_LOG,
    RT_F_INIT_WEIGHTS,
    RT_F_SAVE_WEIGHTS,
    RT_F_SAVE_ADAPTER,
    RT_F_OFFLOAD_DIR,
    RT_F_OFFLOAD_STAGING,
    RT_F_THREADS,
    RT_F_DUMP_STEP,
    RT_F_ARENA_HIGH_WATER,
    RT_F_WEIGHTS,
    RT_F_PROMPT,
    RT_F_MAX_TOKENS,
    RT_F_TEMPERATURE,
    RT_F_TOP_K,
    RT_F_PRINT_LOGITS,
    RT_F_NO_CACHE,
    RT_F_CKPT_DIR,
    RT_F_CKPT_EVERY,
    RT_F_CKPT_KEEP,
    RT_F_CKPT_SYNC,
    RT_F_RESUME,
    RT_F_RESUME_WEIGHTS_ONLY,
    RT_F_TOP_P,
    RT_F_HOST,
    RT_F_PORT,
    RT_F_KV_BLOCKS,
    RT_F_TOKENIZER,
    RT_F_BATCH_TOKENS,
    RT_F_PREFILL_CHUNK,
    RT_F_BATCH_SEQS,
} RtFlagId;

typedef struct RtFlag {
    const char *name;
    const char *arg; /* how --help names the value; NULL: a switch, which takes none */
    unsigned cmds;   /* RT_IN_* of the commands that take it */
    RtFlagId id;
} RtFlag;

static const RtFlag rt_flags[] = {
    {"--steps", "N", RT_IN_TRAIN | RT_IN_EVAL, RT_F_STEPS},
    {"--device", "auto|cpu|cuda", RT_IN_ALL, RT_F_DEVICE},
    {"--seed", "S", RT_IN_ALL, RT_F_SEED},
    {"--data", "GLOB", RT_IN_TRAIN | RT_IN_EVAL, RT_F_DATA},
    {"--log", "FILE.jsonl", RT_IN_TRAIN, RT_F_LOG},
    {"--init-weights", "F.safetensors", RT_IN_TRAIN, RT_F_INIT_WEIGHTS},
    {"--save-weights", "F.safetensors", RT_IN_TRAIN, RT_F_SAVE_WEIGHTS},
    {"--save-adapter", "DIR", RT_IN_TRAIN, RT_F_SAVE_ADAPTER},
    {"--offload-dir", "DIR", RT_IN_TRAIN, RT_F_OFFLOAD_DIR},
    {"--offload-staging", "BYTES", RT_IN_TRAIN, RT_F_OFFLOAD_STAGING},
    {"--threads", "N", RT_IN_ALL, RT_F_THREADS},
    {"--dump-step", "F.safetensors", RT_IN_TRAIN, RT_F_DUMP_STEP},
    {"--arena-high-water", NULL, RT_IN_TRAIN, RT_F_ARENA_HIGH_WATER},
    {"--weights", "F.safetensors", RT_IN_EVAL | RT_IN_GENERATE | RT_IN_SERVE, RT_F_WEIGHTS},
    {"--prompt-tokens", "1,2,3", RT_IN_GENERATE, RT_F_PROMPT},
    {"--max-tokens", "N", RT_IN_GENERATE | RT_IN_SERVE, RT_F_MAX_TOKENS},
    {"--temperature", "T", RT_IN_GENERATE | RT_IN_SERVE, RT_F_TEMPERATURE},
    {"--top-k", "K", RT_IN_GENERATE | RT_IN_SERVE, RT_F_TOP_K},
    {"--top-p", "P", RT_IN_GENERATE | RT_IN_SERVE, RT_F_TOP_P},
    {"--host", "ADDR", RT_IN_SERVE, RT_F_HOST},
    {"--port", "P", RT_IN_SERVE, RT_F_PORT},
    {"--kv-blocks", "N", RT_IN_SERVE, RT_F_KV_BLOCKS},
    {"--tokenizer", "F.json", RT_IN_SERVE, RT_F_TOKENIZER},
    {"--batch-tokens", "N", RT_IN_SERVE, RT_F_BATCH_TOKENS},
    {"--prefill-chunk", "N", RT_IN_GENERATE | RT_IN_SERVE, RT_F_PREFILL_CHUNK},
    {"--batch-seqs", "N", RT_IN_SERVE, RT_F_BATCH_SEQS},
    {"--print-logits", NULL, RT_IN_GENERATE, RT_F_PRINT_LOGITS},
    {"--no-cache", NULL, RT_IN_GENERATE | RT_IN_SERVE, RT_F_NO_CACHE},
    {"--ckpt-dir", "DIR", RT_IN_TRAIN, RT_F_CKPT_DIR},
    {"--ckpt-every", "N", RT_IN_TRAIN, RT_F_CKPT_EVERY},
    {"--ckpt-keep", "N", RT_IN_TRAIN, RT_F_CKPT_KEEP},
    {"--ckpt-sync", NULL, RT_IN_TRAIN, RT_F_CKPT_SYNC},
    {"--resume", "latest|DIR", RT_IN_TRAIN, RT_F_RESUME},
    {"--resume-weights-only", "latest|DIR", RT_IN_TRAIN, RT_F_RESUME_WEIGHTS_ONLY},
};
#define RT_NFLAGS (sizeof rt_flags / sizeof rt_flags[0])

static const char *const rt_commands[] = {"train", "eval", "generate", "serve"};

/* ---- suggestions -------------------------------------------------------------------------------- */

/* Levenshtein distance, capped at 9 (only small distances matter). */
static int rt_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 9;
    int row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            if (up + 1 < best) best = up + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb] > 9 ? 9 : row[lb];
}

/* The candidate closest to word, if close enough to be a likely typo; else NULL. */
static const char *rt_suggest(const char *word, const char *const *cands, size_t n) {
    const char *best = NULL;
    int bd = strlen(word) < 5 ? 2 : 3; /* a distance must be below this */
    for (size_t i = 0; i < n; i++) {
        int d = rt_edit_distance(word, cands[i]);
        if (d < bd) {
            bd = d;
            best = cands[i];
        }
    }
    return best;
}

/* ---- values ------------------------------------------------------------------------------------- */

static RtStatus rt_parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out, RtError *err) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi || *s == '+' || *s == ' ')
        return rt_fail(err, RT_ERR_ARG, "%s needs a whole number from %lld to %lld, not '%s'", flag, (long long)lo, (long long)hi,
                       s);
    *out = v;
    return RT_OK;
}

static RtStatus rt_parse_u64(const char *flag, const char *s, uint64_t *out, RtError *err) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s < '0' || *s > '9')
        return rt_fail(err, RT_ERR_ARG, "%s needs a whole number from 0 to %llu, not '%s'", flag, (unsigned long long)UINT64_MAX,
                       s);
    *out = v;
    return RT_OK;
}

static RtStatus rt_parse_f64(const char *flag, const char *s, double lo, double *out, RtError *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || *s == ' ')
        return rt_fail(err, RT_ERR_ARG, "%s needs a number of at least %g, not '%s'", flag, lo, s);
    *out = v;
    return RT_OK;
}

/* "1,2,3": token ids below vocab. */
static RtStatus rt_parse_prompt(RtOptions *o, const char *s, int64_t vocab, RtError *err) {
    int64_t n = 1;
    for (const char *c = s; *c; c++) n += *c == ',';
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return rt_fail_errno(err, ENOMEM, "cannot hold %lld prompt tokens", (long long)n);
    const char *c = s;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long t = *c >= '0' && *c <= '9' ? strtoll(c, &end, 10) : -1;
        if (t < 0 || errno || (*end != ',' && *end != 0)) {
            free(v);
            return rt_fail(err, RT_ERR_ARG, "--prompt-tokens needs token ids separated by commas, not '%s'", s);
        }
        if (t >= vocab) {
            free(v);
            return rt_fail(err, RT_ERR_ARG, "--prompt-tokens: token %lld is not below the vocabulary size %lld", t,
                           (long long)vocab);
        }
        v[i] = (int32_t)t;
        c = end + (*end == ',');
    }
    free(o->prompt);
    o->prompt = v;
    o->nprompt = n;
    return RT_OK;
}

/* ---- parsing ------------------------------------------------------------------------------------ */

static const char *rt_cmd_name(RtCommand c) {
    return c == RT_CMD_TRAIN      ? "train"
           : c == RT_CMD_EVAL     ? "eval"
           : c == RT_CMD_GENERATE ? "generate"
           : c == RT_CMD_SERVE    ? "serve"
                                  : "help";
}

static unsigned rt_cmd_bit(RtCommand c) {
    return c == RT_CMD_TRAIN      ? RT_IN_TRAIN
           : c == RT_CMD_EVAL     ? RT_IN_EVAL
           : c == RT_CMD_GENERATE ? RT_IN_GENERATE
           : c == RT_CMD_SERVE    ? RT_IN_SERVE
                                  : 0;
}

/* "train", "train and eval", "eval and generate", ... */
static void rt_cmds_text(unsigned cmds, char *buf, size_t n) {
    const char *names[4] = {"", "", "", ""};
    int k = 0;
    for (int i = 0; i < 4; i++)
        if (cmds & (1u << i)) names[k++] = rt_commands[i];
    if (k == 1) snprintf(buf, n, "%s", names[0]);
    else if (k == 2) snprintf(buf, n, "%s and %s", names[0], names[1]);
    else if (k == 3) snprintf(buf, n, "%s, %s and %s", names[0], names[1], names[2]);
    else snprintf(buf, n, "%s, %s, %s and %s", names[0], names[1], names[2], names[3]);
}

static RtStatus rt_unknown_flag(const char *flag, RtCommand cmd, RtError *err) {
    const char *names[RT_NFLAGS];
    size_t n = 0;
    for (size_t i = 0; i < RT_NFLAGS; i++)
        if (rt_flags[i].cmds & rt_cmd_bit(cmd)) names[n++] = rt_flags[i].name;
    const char *s = rt_suggest(flag, names, n);
    if (s) return rt_fail(err, RT_ERR_ARG, "unknown option '%s' for %s (did you mean '%s'?)", flag, rt_cmd_name(cmd), s);
    return rt_fail(err, RT_ERR_ARG, "unknown option '%s' for %s (see --help)", flag, rt_cmd_name(cmd));
}

static RtStatus rt_set_flag(RtOptions *o, const RtProgram *p, const RtFlag *f, const char *v, RtError *err) {
    int64_t i;
    if (!*v && f->arg && f->id != RT_F_PROMPT) return rt_fail(err, RT_ERR_ARG, "%s needs a value", f->name);
    switch (f->id) {
    case RT_F_STEPS:
        if (rt_parse_i64(f->name, v, o->cmd == RT_CMD_EVAL ? 1 : 0, INT64_MAX, &o->steps, err)) return RT_ERR_ARG;
        return RT_OK;
    case RT_F_DEVICE:
        if (strcmp(v, "auto") == 0 || strcmp(v, "cpu") == 0 || strcmp(v, "cuda") == 0) {
            o->device = v;
            return RT_OK;
        }
        return rt_fail(err, RT_ERR_ARG, "--device must be auto, cpu or cuda, not '%s'", v);
    case RT_F_SEED: o->seed_given = 1; return rt_parse_u64(f->name, v, &o->seed, err);
    case RT_F_DATA: /* given again: another data set (tokens([GLOB_A, GLOB_B]) reads one a line) */
        if (strchr(v, '\n')) return rt_fail(err, RT_ERR_ARG, "--data: a glob cannot hold a newline");
        if (o->data) {
            size_t n = strlen(o->data) + strlen(v) + 2;
            char *joined = malloc(n);
            if (!joined) return rt_fail(err, RT_ERR_NOMEM, "--data: out of memory");
            snprintf(joined, n, "%s\n%s", o->data, v);
            free(o->data_owned);
            o->data = o->data_owned = joined;
        } else o->data = v;
        return RT_OK;
    case RT_F_LOG: o->log_path = v; return RT_OK;
    case RT_F_INIT_WEIGHTS: o->init_weights = v; return RT_OK;
    case RT_F_SAVE_WEIGHTS: o->save_weights = v; return RT_OK;
    case RT_F_SAVE_ADAPTER:
        if (!p->train.adapter_config) return rt_adapter_refusal(p, err); /* before the run, not after it */
        o->save_adapter = v;
        return RT_OK;
    case RT_F_OFFLOAD_DIR:
        if (p->train.offload_optimizer != 2 && p->train.offload_act != 2) /* a flag that would do nothing is refused */
            return rt_fail(err, RT_ERR_ARG,
                           "--offload-dir: this program keeps its optimizer state and its activations in memory (it has no "
                           "offload { optimizer = nvme } and offloads no activations)");
        o->offload_dir = v;
        return RT_OK;
    case RT_F_OFFLOAD_STAGING:
        if (p->train.offload_act != 2) /* a flag that would do nothing is refused */
            return rt_fail(err, RT_ERR_ARG,
                           "--offload-staging: this program stages no activations (it has no offload { activations = nvme } "
                           "that the plan carries out)");
        /* at least a page a slot; train.c refuses it where the run is on the CPU, which stages nothing */
        if (rt_parse_i64(f->name, v, 4096 * 4, INT64_MAX / 2, &o->offload_staging, err)) return RT_ERR_ARG;
        return RT_OK;
    case RT_F_DUMP_STEP: o->dump_step = v; return RT_OK;
    case RT_F_ARENA_HIGH_WATER: o->arena_high_water = 1; return RT_OK;
    case RT_F_WEIGHTS: o->weights = v; return RT_OK;
    case RT_F_THREADS:
        if (rt_parse_i64(f->name, v, 1, RT_POOL_MAX_THREADS, &i, err)) return RT_ERR_ARG;
        o->threads = (int)i;
        return RT_OK;
    case RT_F_PROMPT: return rt_parse_prompt(o, v, p->train.vocab, err);
    case RT_F_MAX_TOKENS: return rt_parse_i64(f->name, v, 0, INT32_MAX, &o->max_tokens, err);
    case RT_F_TEMPERATURE: return rt_parse_f64(f->name, v, 0.0, &o->temperature, err);
    case RT_F_TOP_K: return rt_parse_i64(f->name, v, 0, INT64_MAX, &o->top_k, err);
    case RT_F_PRINT_LOGITS: o->print_logits = 1; return RT_OK;
    case RT_F_NO_CACHE: o->no_cache = 1; return RT_OK;
    case RT_F_CKPT_DIR: o->ckpt_dir = v; return RT_OK;
    case RT_F_CKPT_EVERY: return rt_parse_i64(f->name, v, 0, INT64_MAX, &o->ckpt_every, err);
    case RT_F_CKPT_KEEP: return rt_parse_i64(f->name, v, 0, INT64_MAX, &o->ckpt_keep, err);
    case RT_F_CKPT_SYNC: o->ckpt_sync = 1; return RT_OK;
    case RT_F_RESUME: o->resume = v; return RT_OK;
    case RT_F_RESUME_WEIGHTS_ONLY: o->resume_weights_only = v; return RT_OK;
    case RT_F_TOP_P:
        if (rt_parse_f64(f->name, v, 0.0, &o->top_p, err)) return RT_ERR_ARG;
        if (o->top_p <= 0 || o->top_p > 1) return rt_fail(err, RT_ERR_ARG, "--top-p needs a fraction in (0, 1], not '%s'", v);
        return RT_OK;
    case RT_F_HOST: o->host = v; return RT_OK;
    case RT_F_PORT: return rt_parse_i64(f->name, v, 0, 65535, &o->port, err);
    case RT_F_KV_BLOCKS: return rt_parse_i64(f->name, v, 1, INT32_MAX, &o->kv_blocks, err);
    case RT_F_TOKENIZER: o->tokenizer = v; return RT_OK;
    case RT_F_BATCH_TOKENS: return rt_parse_i64(f->name, v, 1, INT32_MAX, &o->batch_tokens, err);
    case RT_F_PREFILL_CHUNK: o->prefill_chunk_given = 1; return rt_parse_i64(f->name, v, 1, INT32_MAX, &o->prefill_chunk, err);
    case RT_F_BATCH_SEQS: return rt_parse_i64(f->name, v, 1, INT32_MAX, &o->batch_seqs, err);
    }
    return rt_fail(err, RT_ERR_ARG, "internal error: flag %s has no parser", f->name);
}

const char *rt_prog_name(const char *argv0) {
    if (!argv0 || !*argv0) return "prog";
    const char *s = strrchr(argv0, '/');
    return s && s[1] ? s + 1 : argv0;
}

void rt_options_free(RtOptions *o) {
    free(o->data_owned);
    o->data_owned = NULL;
    free(o->prompt);
    o->prompt = NULL;
    o->nprompt = 0;
}

/* 'A' or 'A', 'B': the globs of a `data` setting (one a line), quoted for a message. */
void rt_sources_text(char *buf, size_t n, const char *globs) {
    size_t k = 0;
    const char *s = globs ? globs : "";
    k += (size_t)snprintf(buf, n, "'");
    for (; *s && k + 5 < n; s++) {
        if (*s == '\n') k += (size_t)snprintf(buf + k, n - k, "', '");
        else buf[k++] = *s;
    }
    snprintf(buf + k, n - k, "'");
}

/* The data sets a `data` setting names: one glob a line. */
static int64_t rt_count_lines(const char *s) {
    int64_t n = 1;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

RtStatus rt_cli_parse(RtOptions *o, const RtProgram *p, int argc, char **argv, RtError *err) {
    memset(o, 0, sizeof *o);
    o->prog = rt_prog_name(argc > 0 ? argv[0] : NULL);
    o->device = "auto";
    o->seed = p->train.seed;
    o->max_tokens = p->generate.max_tokens;
    o->temperature = p->generate.temperature;
    o->top_k = p->generate.top_k;
    o->top_p = p->generate.top_p;
    o->host = "127.0.0.1";
    o->port = p->generate.port;
    o->tokenizer = p->generate.tokenizer;
    o->batch_tokens = p->generate.batch_tokens;
    o->prefill_chunk = p->generate.prefill_chunk;
    o->batch_seqs = p->generate.batch_seqs;
    o->weights = NULL;
    o->ckpt_dir = o->ckpt_dir_default = p->train.ckpt_dir && *p->train.ckpt_dir ? p->train.ckpt_dir : "checkpoints";
    o->ckpt_every = p->train.ckpt_every;
    o->offload_dir = ".";
    o->ckpt_keep = p->train.ckpt_keep;
    if (argc < 2) return rt_fail(err, RT_ERR_ARG, "no command given; '%s --help' lists the commands", o->prog);
    const char *c = argv[1];
    if (strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0 || strcmp(c, "help") == 0) {
        o->cmd = RT_CMD_HELP;
        return RT_OK;
    }
    if (strcmp(c, "train") == 0) o->cmd = RT_CMD_TRAIN;
    else if (strcmp(c, "eval") == 0) o->cmd = RT_CMD_EVAL;
    else if (strcmp(c, "generate") == 0) o->cmd = RT_CMD_GENERATE;
    else if (strcmp(c, "serve") == 0) o->cmd = RT_CMD_SERVE;
    else if (c[0] == '-')
        return rt_fail(err, RT_ERR_ARG, "'%s' before a command; the commands are train, eval, generate and serve (see --help)",
                       c);
    else {
        const char *s = rt_suggest(c, rt_commands, 4);
        if (s) return rt_fail(err, RT_ERR_ARG, "unknown command '%s' (did you mean '%s'?)", c, s);
        return rt_fail(err, RT_ERR_ARG, "unknown command '%s'; the commands are train, eval, generate and serve", c);
    }
    o->steps = o->cmd == RT_CMD_EVAL ? p->train.eval_steps : p->train.steps;
    o->prompt = malloc(sizeof *o->prompt);
    if (!o->prompt) return rt_fail_errno(err, ENOMEM, "cannot parse the command line");
    o->prompt[0] = 0; /* the default prompt: token 0 */
    o->nprompt = 1;
    int have_name = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            rt_options_free(o);
            o->cmd = RT_CMD_HELP;
            return RT_OK;
        }
        if (strncmp(a, "--", 2) != 0 || strcmp(a, "--") == 0) {
            if (o->cmd != RT_CMD_GENERATE && o->cmd != RT_CMD_SERVE && !have_name && a[0] != '-') {
                if (strcmp(a, p->train.name) != 0) {
                    rt_options_free(o);
                    return rt_fail(err, RT_ERR_ARG, "no train block '%s' in this program (it has '%s')", a, p->train.name);
                }
                have_name = 1;
                continue;
            }
            rt_options_free(o);
            return rt_fail(err, RT_ERR_ARG, "unexpected argument '%s' for %s", a, rt_cmd_name(o->cmd));
        }
        const char *eq = strchr(a, '=');
        size_t klen = eq ? (size_t)(eq - a) : strlen(a);
        const RtFlag *f = NULL;
        for (size_t k = 0; k < RT_NFLAGS; k++)
            if (strlen(rt_flags[k].name) == klen && strncmp(rt_flags[k].name, a, klen) == 0) f = &rt_flags[k];
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(klen < 100 ? klen : 100), a);
        RtStatus st = RT_OK;
        if (!f) {
            st = rt_unknown_flag(key, o->cmd, err);
        } else if (!(f->cmds & rt_cmd_bit(o->cmd))) {
            char which[64];
            rt_cmds_text(f->cmds, which, sizeof which);
            st = rt_fail(err, RT_ERR_ARG, "option '%s' is not for %s (it is for %s)", f->name, rt_cmd_name(o->cmd), which);
        } else if (!f->arg) {
            if (eq) st = rt_fail(err, RT_ERR_ARG, "%s takes no value, not '%s'", f->name, eq + 1);
            else st = rt_set_flag(o, p, f, "", err);
        } else if (!eq && i + 1 >= argc) {
            st = rt_fail(err, RT_ERR_ARG, "%s needs a value", f->name);
        } else {
            st = rt_set_flag(o, p, f, eq ? eq + 1 : argv[++i], err);
        }
        if (st != RT_OK) {
            rt_options_free(o);
            return st;
        }
    }
    if (o->data && (o->cmd == RT_CMD_TRAIN || o->cmd == RT_CMD_EVAL) &&
        rt_count_lines(o->data) != rt_count_lines(p->train.data)) {
        int64_t want = rt_count_lines(p->train.data), got = rt_count_lines(o->data);
        rt_options_free(o);
        return rt_fail(err, RT_ERR_ARG,
                       "--data given %lld time%s, but this program reads %lld data set%s (tokens(...)): give one glob each",
                       (long long)got, got == 1 ? "" : "s", (long long)want, want == 1 ? "" : "s");
    }
    const char *clash = o->resume && o->resume_weights_only         ? "--resume-weights-only"
                        : o->resume && o->init_weights              ? "--init-weights"
                        : o->resume && o->dump_step                 ? "--dump-step"
                        : o->resume_weights_only && o->init_weights ? "--init-weights"
                                                                    : NULL;
    if (clash) {
        rt_options_free(o);
        return rt_fail(err, RT_ERR_ARG, "%s cannot be used with %s", o->resume ? "--resume" : "--resume-weights-only", clash);
    }
    return RT_OK;
}

/* ---- --help ------------------------------------------------------------------------------------- */

static void rt_help_line(FILE *f, const char *flag, const char *arg, const char *what, const char *dflt) {
    char left[64];
    snprintf(left, sizeof left, "%s%s%s", flag, *arg ? " " : "", arg);
    fprintf(f, "  %-30s %s (default %s)\n", left, what, dflt);
}

/* What the executable holds for the GPU: one line. */
static void rt_help_gpu(FILE *f, const RtGpuProgram *g) {
    if (!g) {
        fprintf(f, "Built for the CPU alone (mbtc --cuda-arch=none, or no NVRTC where it was built).\n");
        return;
    }
    fprintf(f, "For the GPU: %lld kernels;", (long long)g->nkernels);
    for (int ptx = 0; ptx < 2; ptx++) {
        int n = 0;
        for (int64_t i = 0; i < g->nimages; i++)
            if (g->images[i].ptx == ptx) fprintf(f, "%s%s", n++ ? ", " : ptx ? " PTX " : " cubins ", g->images[i].arch);
        if (ptx && n) fprintf(f, " (compiled for other GPUs on first use)");
        else if (n) fprintf(f, ";");
    }
    fprintf(f, "\n");
}

void rt_cli_help(FILE *f, const RtProgram *p, const char *prog) {
    const RtTrainSettings *t = &p->train;
    char buf[512], buf2[512];
    fprintf(f, "usage: %s COMMAND [options]\n\n", prog);
    fprintf(f, "A program compiled from %s, train block '%s'.\n", p->source ? p->source : "?", t->name);
    rt_help_gpu(f, p->gpu);
    fprintf(f, "Flags override the program's settings, which are the defaults shown; a flag is\n"
               "'--flag value' or '--flag=value'.\n\n");
    fprintf(f, "commands:\n");
    char left[128];
    snprintf(left, sizeof left, "train [%s]", t->name);
    fprintf(f, "  %-30s train the model: %lld steps of %lld sequences of %lld tokens\n", left, (long long)t->steps,
            (long long)t->global, (long long)t->seq);
    snprintf(left, sizeof left, "eval [%s]", t->name);
    fprintf(f, "  %-30s the loss on held-out data\n", left);
    fprintf(f, "  generate                       continue a prompt, one token id at a time\n");
    fprintf(f, "  serve                          an OpenAI-compatible HTTP server (docs/serve.md)\n");
    fprintf(f, "  info                           the memory plan: arena, regions, kernels and GEMMs per step\n");
    fprintf(f, "  --help                         this text\n");

    char cpus[64];
    snprintf(cpus, sizeof cpus, "%d: the CPUs this process may use", rt_cpu_count());
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);

    fprintf(f, "\ntrain options:\n");
    snprintf(buf, sizeof buf, "%lld", (long long)t->steps);
    rt_help_line(f, "--steps", "N", "optimizer steps", buf);
    rt_help_line(f, "--device", "auto|cpu|cuda", "where to run; auto is the GPU when there is one", "auto");
    rt_help_line(f, "--seed", "S", "seeds initialisation and the data order", seed);
    rt_sources_text(buf, sizeof buf, t->data);
    rt_help_line(f, "--data", "GLOB", "training token shards (llm.c or nanoGPT format); once a data set", buf);
    rt_help_line(f, "--log", "FILE.jsonl", "also write one JSON object per step to FILE", "none");
    rt_help_line(f, "--init-weights", "F.safetensors", "start from these weights instead of the initialisers", "none");
    rt_help_line(f, "--save-weights", "F.safetensors", "write the trained weights (f32) at the end", "none");
    if (t->adapter_modules)
        rt_help_line(f, "--save-adapter", "DIR", "write the LoRA adapters at the end for PEFT (adapter_model.safetensors)",
                     "none");
    if (t->offload_optimizer == 2)
        rt_help_line(f, "--offload-dir", "DIR",
                     "where offload { optimizer = nvme } and { activations = nvme } keep their store files", "'.'");
    if (t->offload_act == 2)
        rt_help_line(f, "--offload-staging", "BYTES",
                     "on a GPU, the pinned host memory the activations go through to and from their store file", "64 MiB");
    rt_help_line(f, "--threads", "N", "CPU threads", cpus);
    rt_help_line(f, "--dump-step", "F.safetensors",
                 "write step 1's weights, batches, loss and gradients (for mbtc --verify-step)", "none");
    rt_help_line(f, "--arena-high-water", "",
                 "measure the arena bytes step 1's micro-batches write and print them beside the plan's step peak", "off");
    snprintf(buf, sizeof buf, "'%s'", t->ckpt_dir && *t->ckpt_dir ? t->ckpt_dir : "checkpoints"); /* as rt_cli_parse's default */
    rt_help_line(f, "--ckpt-dir", "DIR", "where checkpoints go (DIR/step-N, DIR/latest)", buf);
    snprintf(buf, sizeof buf, "%lld%s", (long long)t->ckpt_every, t->ckpt_every ? "" : ": only on SIGTERM or SIGINT");
    rt_help_line(f, "--ckpt-every", "N", "write a checkpoint every N steps, and at the end", buf);
    snprintf(buf, sizeof buf, "%lld%s", (long long)t->ckpt_keep, t->ckpt_keep ? "" : ": all");
    rt_help_line(f, "--ckpt-keep", "N", "keep the newest N checkpoints", buf);
    rt_help_line(f, "--ckpt-sync", "", "training waits for each checkpoint to be written", "off: written in the background");
    rt_help_line(f, "--resume", "latest|DIR", "go on from a checkpoint of this program, bit-exactly", "none");
    rt_help_line(f, "--resume-weights-only", "latest|DIR", "start afresh from a checkpoint's weights", "none");

    fprintf(f, "\neval options:\n");
    rt_help_line(f, "--weights", "F.safetensors", "the weights to evaluate", "none: the initialised model");
    if (t->val_data && *t->val_data) rt_sources_text(buf, sizeof buf, t->val_data);
    else {
        rt_sources_text(buf2, sizeof buf2, t->data);
        snprintf(buf, sizeof buf, "the last %lld windows of %.440s, which training does not visit",
                 (long long)(t->eval_steps * t->global), buf2);
    }
    rt_help_line(f, "--data", "GLOB", "held-out token shards", buf);
    snprintf(buf2, sizeof buf2, "%lld", (long long)t->eval_steps);
    snprintf(buf, sizeof buf, "batches of %lld sequences (fewer if the data hold fewer)", (long long)t->global);
    rt_help_line(f, "--steps", "N", buf, buf2);
    rt_help_line(f, "--seed", "S", "seeds the initialisation when there is no --weights", seed);
    rt_help_line(f, "--device", "auto|cpu|cuda", "where to run", "auto");
    rt_help_line(f, "--threads", "N", "CPU threads", cpus);

    fprintf(f, "\ngenerate options:\n");
    if (p->generate.weights) snprintf(buf, sizeof buf, "'%s'", p->generate.weights);
    else snprintf(buf, sizeof buf, "none: required");
    rt_help_line(f, "--weights", "F.safetensors", "the model's weights", buf);
    rt_help_line(f, "--prompt-tokens", "1,2,3", "the prompt, as token ids", "0");
    snprintf(buf, sizeof buf, "%lld", (long long)p->generate.max_tokens);
    rt_help_line(f, "--max-tokens", "N", "tokens to generate", buf);
    snprintf(buf, sizeof buf, "%g", p->generate.temperature);
    rt_help_line(f, "--temperature", "T", "sampling temperature; 0 is greedy (the likeliest token)", buf);
    snprintf(buf, sizeof buf, "%lld%s", (long long)p->generate.top_k, p->generate.top_k == 0 ? ": all" : "");
    rt_help_line(f, "--top-k", "K", "sample among the K likeliest tokens", buf);
    snprintf(buf, sizeof buf, "%g", p->generate.top_p);
    rt_help_line(f, "--top-p", "P", "sample among the likeliest tokens whose probabilities sum to P", buf);
    rt_help_line(f, "--seed", "S", "seeds the sampling", seed);
    rt_help_line(f, "--print-logits", "", "instead of generating, print the logits after each prefix of the prompt", "off");
    rt_help_line(f, "--no-cache", "", "recompute the whole context for every token instead of using the KV cache (serve too)",
                 "off");
    rt_help_line(f, "--device", "auto|cpu|cuda", "where to run", "auto");
    rt_help_line(f, "--threads", "N", "CPU threads", cpus);
    fprintf(f, "\nserve options (also --weights, --max-tokens, --temperature, --top-k, --top-p, --seed, --device,\n"
               "--threads as for generate; a request's fields override the sampling ones; docs/serve.md):\n");
    rt_help_line(f, "--host", "ADDR", "the address to listen on", "127.0.0.1");
    snprintf(buf, sizeof buf, "%lld", (long long)p->generate.port);
    rt_help_line(f, "--port", "P", "the HTTP port (0: any free port, printed)", buf);
    snprintf(buf, sizeof buf, "%s", p->generate.tokenizer ? p->generate.tokenizer : "none: prompts are token ids");
    rt_help_line(f, "--tokenizer", "F.json", "a Hugging Face tokenizer.json, or GPT-2's vocab.json (merges.txt beside it)", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)p->generate.batch_tokens);
    rt_help_line(f, "--batch-tokens", "N", "new tokens an iteration: decodes first, then prefill chunks", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)p->generate.prefill_chunk);
    rt_help_line(f, "--prefill-chunk", "N", "the longest piece of a prompt one iteration (generate: one cached step) takes", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)p->generate.batch_seqs);
    rt_help_line(f, "--batch-seqs", "N", "sequences an iteration", buf);
    rt_help_line(f, "--kv-blocks", "N", "KV blocks in the pool", "from kv.memory (docs/serve.md)");
    fprintf(f, "\nExit status: 0 success, 1 a mistake in the command line, the data or a weights file, 2 an\n"
               "internal error. docs/runtime.md describes the logs, the data formats and determinism.\n");
}

/* ---- the device -------------------------------------------------------------------------------- */

RtDeviceWant rt_device_want(const RtOptions *o) {
    return strcmp(o->device, "cuda") == 0 ? RT_DEVICE_CUDA : strcmp(o->device, "cpu") == 0 ? RT_DEVICE_CPU : RT_DEVICE_AUTO;
}

/* Why --device auto chose the CPU, in the words of the `device:` line. A machine without a CUDA
 * driver and a program built for the CPU alone are the ordinary cases of a CPU run: they read as
 * a note, not as an error (`--device cuda` gives the loader's text); anything else - a driver
 * that fails, a GPU the program has no image for - keeps rt_gpu_open's detail. */
static const char *rt_cpu_note(const char *why, char *buf, size_t cap) {
    if (!why) return "auto";
    if (strncmp(why, "no CUDA driver (libcuda.so.1 on the loader's path:", 50) == 0)
        return "auto: no CUDA driver on this machine";
    if (strcmp(why, "the program was built without CUDA") == 0) return "auto: the program was built for the CPU";
    snprintf(buf, cap, "auto: the GPU is not used: %s", why);
    return buf;
}

/* The `device:` line: the GPU, or the CPU's threads (and, under auto, why not a GPU). */
void rt_print_device(const RtOptions *o, const RtExec *x) {
    char buf[RT_ERROR_MAX + 64];
    if (x->gpu) printf("device: cuda, %s\n", rt_exec_device(x));
    else if (strcmp(o->device, "auto") != 0) printf("device: cpu, %d threads\n", rt_pool_threads(x->pool));
    else printf("device: cpu (%s), %d threads\n", rt_cpu_note(x->cpu_reason, buf, sizeof buf), rt_pool_threads(x->pool));
}
