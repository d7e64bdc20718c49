/* rt_exec.h - the executable's side of libmbtrt: the command line, the train / eval / generate
 * commands, progress logging and weights files, all driven by an RtProgram (rt_program.h).
 *
 * Pipeline position: runtime/main.c is the `main` of every executable mbtc builds; it calls
 * rt_main with the program's descriptor. Generated code never includes this header: its whole
 * interface is rt_program.h. Tests use the pieces here directly (sampling, the CLI parser).
 *
 *   cli.c       the command line (`train`, `eval`, `generate`, `--help`) into RtOptions
 *   train.c     rt_main, the regions, the train loop, evaluation
 *   log.c       progress on the terminal or as plain lines, and the --log JSONL file
 *   weights.c   parameters to and from safetensors files by their dotted names
 *   generate.c  token generation: greedy, or temperature and top-k sampling
 *
 * Exit statuses: 0 success; 1 a user error (a bad flag, missing data, a bad weights file), printed
 * as one line `PROG: message`; 2 an internal error (an invalid program descriptor). */
#ifndef MBT_RT_EXEC_H
#define MBT_RT_EXEC_H

#include <stdio.h>

#include "rt_program.h"

/* ==== the command line (cli.c) =============================================================== */

typedef enum RtCommand {
    RT_CMD_HELP,     /* --help (or `COMMAND --help`) */
    RT_CMD_TRAIN,    /* train [NAME] ... */
    RT_CMD_EVAL,     /* eval [NAME] ... */
    RT_CMD_GENERATE, /* generate ... */
} RtCommand;

/* What the command line asked for, with the program's settings filled in where no flag was
 * given. Strings point into argv or the program's descriptor. */
typedef struct RtOptions {
    RtCommand cmd;
    const char *prog;          /* argv[0]'s last component, the prefix of every message */
    int64_t steps;             /* train: optimizer steps; eval: batches */
    uint64_t seed;             /* train/eval: initialisation and data order; generate: sampling */
    int threads;               /* 0: rt_cpu_count() */
    const char *device;        /* "auto" or "cpu" */
    const char *data;          /* train: training glob; eval: the held-out glob (NULL: the program's) */
    const char *log_path;      /* train: --log FILE.jsonl, or NULL */
    const char *init_weights;  /* train: --init-weights, or NULL */
    const char *save_weights;  /* train: --save-weights, or NULL */
    const char *dump_step;     /* train: --dump-step, or NULL (rt_step_dump) */
    const char *weights;       /* eval/generate: --weights, or NULL */
    int32_t *prompt;           /* generate: the prompt's token ids (owned; rt_options_free) */
    int64_t nprompt;
    int64_t max_tokens;        /* generate */
    double temperature;        /* generate: 0 is greedy */
    int64_t top_k;             /* generate: 0 is all tokens */
    int print_logits;          /* generate --print-logits: print the logits after each prefix of the prompt, generate nothing */
} RtOptions;

/* Parses argv against the program's settings. A bad command line fills err with the message
 * (without the "PROG: " prefix) and returns RT_ERR_ARG. */
RtStatus rt_cli_parse(RtOptions *o, const RtProgram *p, int argc, char **argv, RtError *err);
void rt_options_free(RtOptions *o);                                 /* frees the prompt */
const char *rt_prog_name(const char *argv0);                        /* argv0's last path component ("prog" when empty) */
void rt_cli_help(FILE *f, const RtProgram *p, const char *prog);    /* the --help text, every flag with its default */

/* ==== running (train.c) ====================================================================== */

int rt_main(int argc, char **argv, const RtProgram *p);      /* parses, dispatches, returns the exit status */
RtStatus rt_program_check(const RtProgram *p, RtError *err); /* the descriptor is self-consistent (else an internal error) */
/* The batch of 0-based optimizer step `step`: the ramp stage in force then (.step is where it
 * starts; the base stage is {0, global, accum}). The step runs accum x data micro-batches. */
RtRampStage rt_train_stage(const RtTrainSettings *t, int64_t step);

/* The memory of a run: the pool and the regions, RT_ALIGN-aligned. */
typedef struct RtExec {
    const RtProgram *prog;
    RtPool *pool;
    float *params, *grads, *state; /* param_floats, param_floats, state_floats */
    unsigned char *arena;          /* arena_bytes */
    int32_t *x, *y;                /* one micro-batch: [micro, seq] each (or [1, logits_seq]) */
} RtExec;

RtStatus rt_exec_open(RtExec *e, const RtProgram *p, int threads, RtError *err); /* pool + zeroed regions */
void rt_exec_close(RtExec *e);
RtStatus rt_exec_init_params(RtExec *e, uint64_t seed, RtError *err); /* every parameter from its initialiser */

int rt_cmd_train(const RtProgram *p, const RtOptions *o);    /* exit status */
int rt_cmd_eval(const RtProgram *p, const RtOptions *o);     /* exit status */
int rt_cmd_generate(const RtProgram *p, const RtOptions *o); /* exit status (generate.c) */

/* ==== progress and the JSONL log (log.c) ===================================================== */

/* One optimizer step as logged. */
typedef struct RtStepLog {
    int64_t step;        /* 1-based: the step just done */
    double loss;         /* its loss (the global batch's mean) */
    double lr;           /* the learning rate it used */
    double grad_norm;    /* the gradient's global L2 norm before clipping */
    double ms;           /* its wall time */
    int64_t tokens;      /* tokens it consumed */
} RtStepLog;

typedef struct RtLog {
    FILE *out;           /* progress (stdout) */
    int tty;             /* out is a terminal: one line redrawn in place */
    FILE *jsonl;         /* --log, or NULL */
    const char *jsonl_path;
    int64_t total_steps;
    double t_start;      /* monotonic seconds at rt_log_open */
    double last_draw;    /* when the terminal line was last redrawn */
    double timed_ms;     /* wall time of the steps after the first (ETA) */
    int64_t timed_steps;
    int line_open;       /* a terminal line is showing without its newline */
} RtLog;

RtStatus rt_log_open(RtLog *l, FILE *out, int tty, const char *jsonl_path, int64_t total_steps, RtError *err);
RtStatus rt_log_step(RtLog *l, const RtStepLog *s, RtError *err);                       /* a step: the line, the JSON object */
RtStatus rt_log_eval(RtLog *l, int64_t step, double loss, int64_t batches, RtError *err); /* a val loss, on its own line */
RtStatus rt_log_close(RtLog *l, RtError *err);                                          /* ends the line, closes the file */
double rt_now(void);                                                                    /* monotonic seconds */

/* ==== weights (weights.c) ==================================================================== */

/* Reads every parameter of p by its dotted name from a safetensors file (F32, F16, BF16 or F64,
 * converted to f32); a missing tensor or a shape mismatch is an error. *unused counts the file's
 * tensors that are not parameters of p (the caller may mention them). */
RtStatus rt_weights_load(const RtProgram *p, float *params, const char *path, int64_t *unused, RtError *err);
/* Writes every parameter as F32 under its dotted name, metadata {"format": "pt"}, atomically. */
RtStatus rt_weights_save(const RtProgram *p, const float *params, const char *path, RtError *err);

/* `train --dump-step F`: step 1 as the compiled program computed it, for checking it against
 * another implementation (mbtc --verify-step evaluates the same step in double precision;
 * tests/torch/ runs it in PyTorch). The file holds, as safetensors:
 *   NAME              every parameter, f32, the values the step started from (so the file is
 *                     also a weights file for --init-weights)
 *   grad:NAME         its gradient of the step's objective (the mean loss over the global batch),
 *                     accumulated over the micro-batches, before clipping
 *   next:NAME         the parameter after clipping and the optimizer's update
 *   batch:x, batch:y  the step's token ids, i32 [accum x micro, seq], micro-batch after micro-batch
 * and the metadata mbt.loss (the step's loss), mbt.lr (the rate the update used), mbt.clip (the
 * clipping threshold, 0 for none), mbt.micro, mbt.accum, mbt.seq. ':' never occurs in a
 * parameter's dotted name, so the names cannot collide. */
typedef struct RtStepDump {
    const float *params, *grads, *next; /* each param_floats, laid out as the parameter region */
    const int32_t *x, *y;               /* [accum x micro, seq] */
    int64_t accum;
    double loss, lr, clip;
} RtStepDump;
RtStatus rt_step_dump(const RtProgram *p, const RtStepDump *d, const char *path, RtError *err);

/* ==== sampling (generate.c) ================================================================== */

/* The next token from logits[0, vocab): the largest (lowest id on ties) when temperature is 0 or
 * top_k is 1; otherwise softmax(logits / temperature) over the top_k largest (0: all; ties by
 * lower id), sampled by inverting its CDF at u in [0, 1). scratch holds 8 x vocab bytes. */
int32_t rt_sample_token(const float *logits, int64_t vocab, double temperature, int64_t top_k, double u, void *scratch);

#endif
