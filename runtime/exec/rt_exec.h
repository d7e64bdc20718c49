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
 *   checkpoint.c  checkpoints: asynchronous atomic writes, resuming, keeping the newest N
 *   generate.c  token generation: greedy, or temperature and top-k sampling
 *
 * Exit statuses: 0 success; 1 a user error (a bad flag, missing data, a bad weights file), printed
 * as one line `PROG: message`; 2 an internal error (an invalid program descriptor). */
#ifndef MBT_RT_EXEC_H
#define MBT_RT_EXEC_H

#include <stdio.h>

#include "rt_gpu.h"
#include "rt_program.h"

/* ==== the command line (cli.c) =============================================================== */

typedef enum RtCommand {
    RT_CMD_HELP,     /* --help (or `COMMAND --help`) */
    RT_CMD_TRAIN,    /* train [NAME] ... */
    RT_CMD_EVAL,     /* eval [NAME] ... */
    RT_CMD_GENERATE, /* generate ... */
    RT_CMD_SERVE,    /* serve ... (runtime/serve/) */
} RtCommand;

/* What the command line asked for, with the program's settings filled in where no flag was
 * given. Strings point into argv or the program's descriptor. */
typedef struct RtOptions {
    RtCommand cmd;
    const char *prog;         /* argv[0]'s last component, the prefix of every message */
    int64_t steps;            /* train: optimizer steps; eval: batches */
    uint64_t seed;            /* train/eval: initialisation and data order; generate: sampling */
    int threads;              /* 0: rt_cpu_count() */
    const char *device;       /* "auto", "cpu" or "cuda" */
    const char *data;         /* train: training glob; eval: the held-out glob (NULL: the program's); --data given
                                 N times: the N globs one a line (data_owned), one data set each */
    char *data_owned;         /* rt_options_free */
    const char *log_path;     /* train: --log FILE.jsonl, or NULL */
    const char *init_weights; /* train: --init-weights, or NULL */
    const char *save_weights; /* train: --save-weights, or NULL */
    const char *save_adapter; /* train: --save-adapter DIR, or NULL (rt_adapter_save) */
    const char *dump_step;    /* train: --dump-step, or NULL (rt_step_dump) */
    int arena_high_water;     /* train --arena-high-water: measure the arena's high-water mark of step 1's micro-batches */
    const char *offload_dir;  /* train: --offload-dir, the store file's directory with offload { optimizer = nvme } (".") */
    int64_t offload_staging;  /* train: --offload-staging BYTES, activations = nvme's pinned staging on the GPU (0: default) */
    const char *weights;      /* eval/generate: --weights, or NULL */
    int32_t *prompt;          /* generate: the prompt's token ids (owned; rt_options_free) */
    int64_t nprompt;
    int64_t max_tokens;      /* generate */
    double temperature;      /* generate: 0 is greedy */
    int64_t top_k;           /* generate: 0 is all tokens */
    int print_logits;        /* generate --print-logits: print the logits after each prefix of the prompt, generate nothing */
    int no_cache;            /* generate --no-cache: forward_logits over the whole context per token, not forward_chunk */
    int prefill_chunk_given; /* --prefill-chunk was on the command line (generate: prompt tokens a cached step) */
    int seed_given;          /* --seed was on the command line */
    const char *ckpt_dir;    /* train: --ckpt-dir (the program's checkpoint { dir } by default) */
    const char *ckpt_dir_default;    /* the program's checkpoint { dir }, or "checkpoints" */
    int64_t ckpt_every;              /* train: --ckpt-every N; 0: none (the program's checkpoint { every } by default) */
    int64_t ckpt_keep;               /* train: --ckpt-keep N; 0: all (the program's checkpoint { keep } by default) */
    int ckpt_sync;                   /* train: --ckpt-sync: training waits for every write (for comparison) */
    const char *resume;              /* train: --resume latest|DIR, or NULL */
    const char *resume_weights_only; /* train: --resume-weights-only latest|DIR, or NULL */
    double top_p;                    /* generate/serve: nucleus mass, (0, 1] */
    const char *host;                /* serve: --host (127.0.0.1) */
    int64_t port;                    /* serve: --port (the serve block's port; 0: any free port) */
    int64_t kv_blocks;               /* serve: --kv-blocks; 0: from kv.memory */
    const char *tokenizer;           /* serve: --tokenizer, or the serve block's, or NULL */
    int64_t batch_tokens, prefill_chunk, batch_seqs; /* serve: the batch settings */
} RtOptions;

/* Parses argv against the program's settings. A bad command line fills err with the message
 * (without the "PROG: " prefix) and returns RT_ERR_ARG. */
RtStatus rt_cli_parse(RtOptions *o, const RtProgram *p, int argc, char **argv, RtError *err);
void rt_sources_text(char *buf, size_t n, const char *globs);    /* 'A', 'B': a data setting's globs (one a line), quoted */
void rt_options_free(RtOptions *o);                              /* frees the prompt */
const char *rt_prog_name(const char *argv0);                     /* argv0's last path component ("prog" when empty) */
void rt_cli_help(FILE *f, const RtProgram *p, const char *prog); /* the --help text, every flag with its default */

/* ==== running (train.c) ====================================================================== */

int rt_main(int argc, char **argv, const RtProgram *p);           /* parses, dispatches, returns the exit status */
int rt_cmd_info(const RtProgram *p, const char *prog, int nargs); /* `PROG info` (info.c): the memory plan; the exit status */
RtStatus rt_program_check(const RtProgram *p, RtError *err);      /* the descriptor is self-consistent (else an internal error) */
/* The batch of 0-based optimizer step `step`: the ramp stage in force then (.step is where it
 * starts; the base stage is {0, global, accum}). The step runs accum x data micro-batches. */
RtRampStage rt_train_stage(const RtTrainSettings *t, int64_t step);
/* The window length of 0-based step `step` under the sequence-length curriculum (seq without one) */
int64_t rt_train_seq_len(const RtTrainSettings *t, int64_t step);

/* The deepest stack of partial sums the step's gradient tree may need: 2^(RT_TREE_MAX-1) local
 * micro-batches. */
#define RT_TREE_MAX 40

/* The memory of a run (exec.c): the pool and the regions, RT_ALIGN-aligned, on the device that
 * runs the program. On the CPU the host regions are the regions. On the GPU (gpu != NULL) the
 * d_* regions are, and params / grads / state are host copies moved by rt_exec_push / pull. */
typedef struct RtExec {
    const RtProgram *prog;
    RtPool *pool;
    RtGpu *gpu;                          /* NULL: the CPU runs the program */
    const char *cpu_reason;              /* --device auto on the CPU: why not the GPU (static storage), or NULL */
    float *params, *grads, *state;       /* param_floats, param_floats, state_len (NULL with offload { optimizer = nvme }) */
    int64_t state_len;                   /* the state regions' floats: state_floats, or ZeRO's shard (rt_exec_shard_state) */
    unsigned char *arena;                /* arena_bytes (the CPU's; NULL on the GPU) */
    int32_t *x, *y;                      /* one micro-batch: [micro, seq] each (or [1, logits_seq]); page-locked on the GPU */
    int32_t *x_next, *y_next;            /* the GPU's other pair, filled while the GPU runs the micro-batch before */
    float *d_params, *d_grads, *d_state; /* the GPU's regions (device addresses) */
    unsigned char *d_arena;
    int32_t *d_x, *d_y;
    int32_t *pos, *d_pos; /* with documents (train.docs >= 0): data.pos, computed from x by rt_exec_batch; else NULL */
    /* the window length rt_exec_batch numbers data.pos by: a training step's curriculum length
     * (rt_train_seq_len; positions restart every `row` tokens); 0: seq */
    int64_t row;
    /* The step's partial sums (rt_exec_tree_*): tree[0] is the gradient region (d_grads on the
     * GPU), tree[1..ntree-1] extra regions of param_floats on the running device. */
    float *tree[RT_TREE_MAX];
    int ntree;
    /* global_mean (RtProgram.stat_floats > 0): the step's statistics (read by forward_backward and
     * forward_loss; the GPU's copy d_stats) and one micro-batch's, which forward_stats writes */
    float *stats, *stats_out, *d_stats;
    /* offload { activations = nvme } (docs/memory.md): the store forward_backward copies held
     * activations to (rt_act_copy), opened by rt_exec_act_open or at the first copy in act_dir
     * (NULL: the current directory); act_wait_s: the seconds its waits took */
    struct RtStore *act_store;
    unsigned char *act_host; /* offload { activations = host } run on the CPU: the copies' memory */
    const char *act_dir;
    double act_wait_s;
    int64_t act_staging; /* nvme on the GPU: the pinned staging's bytes (train --offload-staging; 0: the default) */
    /* ZeRO-3 (docs/parallel.md): the RtParamHook every RtStep of rt_exec_step carries (the CPU's
     * and the GPU's forward_backward, forward_loss and forward_stats call it around their
     * parameter reads);
     * NULL without */
    const void *param_hook;
    /* ZeRO-3 on the GPU: d_params is a region whose elements [d_param_lo, d_param_hi) alone are
     * always on the device (the rank's shard): rt_exec_push and rt_exec_pull move those alone
     * (d_param_hi 0: the whole region, as without) */
    int64_t d_param_lo, d_param_hi;
    /* The parameter casts' region (RtProgram.pcast_bytes > 0; docs/memory.md, "The parameter casts'
     * region"): the host's (the CPU's, or a GPU build's scratch for the CPU's optimizer_update with
     * offload { optimizer }) and the device's. pcasts_current: the region holds the casts of the
     * parameters as they are now, so a step's first micro-batch may skip the casts
     * (RtStep.casts_kept 2). Set by the train loop after a forward_backward; kept across a
     * whole-region optimizer_update on the running device; cleared by rt_exec_push and
     * rt_exec_running, and by the train loop after a GPU build's host update and a ZeRO shard
     * update whose casts were not gathered (rt_train_gather_params): every other writer of the
     * parameters. */
    void *pcasts, *d_pcasts;
    int pcasts_current;
    /* offload { optimizer } on the GPU: params and grads are page-locked (what cuMemHostAlloc gave:
     * params_raw, grads_raw; else NULL), pinned_bytes in all (gpu_opt.c copies them) */
    void *params_raw, *grads_raw;
    int64_t pinned_bytes;
} RtExec;

/* Opens the device (rt_gpu_open: AUTO falls back to the CPU, saying why in cpu_reason), the pool
 * and zeroed regions. */
RtStatus rt_exec_open(RtExec *e, const RtProgram *p, int threads, RtDeviceWant want, RtError *err);
void rt_exec_close(RtExec *e);
/* offload { activations = nvme }: opens the store DIR/NAME of RtTrainSettings.offload_act_bytes
 * (nothing when 0); = host (offload_act 1): that many bytes of pinned host memory and the copy
 * stream on the GPU (rt_gpu_act_open; dir and name unused), plain memory on the CPU.
 * forward_backward calls rt_act_copy at the plan's points: op 0 queues a write of buf[0, len) at
 * byte off of the store, 1 a read into it, 2 waits for the last copy queued at off (buf and len
 * unused; on the GPU that copy and those queued before it, not later ones - off < 0: everything
 * queued; the CPU's store waits for everything queued); a failure (the store's message) fails the
 * call. */
RtStatus rt_exec_act_open(RtExec *e, const char *dir, const char *name, RtError *err);
int32_t rt_act_copy(RtExec *e, int32_t op, int64_t off, void *buf, int64_t len, RtError *err);
/* The arena's high-water mark, measured (train --arena-high-water; docs/memory.md): mark fills
 * the arena (the GPU's through the host) with RT_ARENA_PATTERN; high then finds the last byte that
 * no longer holds it, so *bytes is one past the highest byte any call since the mark wrote (0:
 * none). A value written that happens to end in pattern bytes counts as unwritten, so the mark can
 * only fall short of the truth, by fewer bytes than that value has. */
#define RT_ARENA_PATTERN 0xA5
RtStatus rt_exec_arena_mark(RtExec *e, RtError *err);
RtStatus rt_exec_arena_high(RtExec *e, int64_t *bytes, RtError *err);
const char *rt_exec_device(const RtExec *e); /* "cpu", or rt_gpu_describe's line */
/* the host's parameters and state to the GPU (CPU: nothing); the first allocates the GPU's state region */
RtStatus rt_exec_push(RtExec *e, RtError *err);
/* ZeRO: the state region becomes `shard` (len floats, malloc'ed; the exec owns it from now), before
 * the first rt_exec_push, which allocates the GPU's at that size (the whole state never is). */
RtStatus rt_exec_shard_state(RtExec *e, float *shard, int64_t len, RtError *err);
enum { RT_PULL_PARAMS = 1, RT_PULL_GRADS = 2, RT_PULL_STATE = 4 };
RtStatus rt_exec_pull(RtExec *e, int what, RtError *err); /* the GPU's regions to the host copies (CPU: nothing) */
/* x and y, `tokens` each, to the GPU (CPU: nothing); with documents, first data.pos from x (rt_doc_positions) */
RtStatus rt_exec_batch(RtExec *e, int64_t tokens, RtError *err);
/* data.pos of rows of `row` tokens: 0 at a row's start and after each `eot` token, else one more
 * than the token before (a document's tokens are numbered from 0; one cut by a row's end goes on
 * in the next row as a new document). */
void rt_doc_positions(const int32_t *x, int64_t tokens, int64_t row, int64_t eot, int32_t *pos);
/* An RtStep with the running device's regions, pool or GPU, and err; the caller sets the rest. */
RtStep rt_exec_step(const RtExec *e, RtError *err);
typedef enum RtExecFn {
    RT_EXEC_FORWARD_BACKWARD,
    RT_EXEC_FORWARD_LOSS,
    RT_EXEC_FORWARD_LOGITS,
    RT_EXEC_UPDATE,
    RT_EXEC_FORWARD_STATS, /* returns with stats_out filled (its copy to the host waits) */
    RT_EXEC_FORWARD_CHUNK  /* the chunk phase (KV cache): RtStep.kv and kv_pool in the device's memory */
} RtExecFn;
/* stats (the host's) to the GPU's d_stats (CPU: nothing). */
RtStatus rt_exec_stats(RtExec *e, RtError *err);
/* The running statistics' update after an optimizer step (RtProgram.running): each buffer
 * becomes (1 - m) itself + m its statistic over the step (stats, the host's; on the GPU the
 * buffer's slice is downloaded, updated on the host and uploaded). */
RtStatus rt_exec_running(RtExec *e, RtError *err);
/* The running device's version of the function. rt_exec_call returns when it is done (s->loss
 * set); rt_exec_queue may return with it queued on the GPU: s->loss is NaN until rt_exec_wait,
 * and s must live until then. rt_exec_flip makes the other pair of batch buffers x and y (GPU;
 * the CPU has one pair), so that the next micro-batch is read while the GPU runs this one. */
RtStatus rt_exec_call(RtExec *e, RtExecFn fn, RtStep *s);
RtStatus rt_exec_queue(RtExec *e, RtExecFn fn, RtStep *s);
RtStatus rt_exec_wait(RtExec *e, RtError *err);
void rt_exec_flip(RtExec *e);
/* The gradient region's passes. The norm sums blocks of RT_GRAD_BLOCK elements (a constant, so the
 * sum never depends on the thread count), each in double, then the blocks in order; partial holds
 * rt_exec_grad_blocks of them. */
#define RT_GRAD_BLOCK 16384
int64_t rt_exec_grad_blocks(const RtProgram *p);

/* The optimizer state region is nstate parts, each laid out as the parameter region's first part
 * floats: every parameter the optimizer updates; the frozen ones (issue 20's parameter groups),
 * laid out after them, have no state. part = param_floats when nothing is frozen. */
static inline int64_t rt_state_part(const RtProgram *p) { return p->nstate > 0 ? p->state_floats / p->nstate : 0; }
/* Whether parameter q has optimizer state (is not frozen). */
static inline int rt_has_state(const RtProgram *p, const RtParam *q) { return q->offset + q->numel <= rt_state_part(p); }
RtStatus rt_exec_grad_norm(RtExec *e, double *partial, double *norm, RtError *err);
RtStatus rt_exec_grad_scale(RtExec *e, float scale, RtError *err);
/* The CPU's sums of squares of blocks [b0, b1) alone into partial[b0, b1) (ZeRO-2: a rank's shard). */
void rt_exec_grad_norm_blocks(RtExec *e, double *partial, int64_t b0, int64_t b1);
RtStatus rt_exec_grad_zero(RtExec *e, RtError *err);
/* The step's gradient as one fixed binary tree over its micro-batches (docs/parallel.md, "The
 * step"): each micro-batch's forward_backward adds into a zeroed region, and a binary-counter
 * stack of partial sums combines them, ((g0 + g1) + (g2 + g3)) + ..., so that the sum's bits depend
 * only on the number of micro-batches, never on who computed them. rt_exec_tree_open makes room
 * for up to `leaves` micro-batches (floor(log2 leaves) regions besides the gradient region).
 * rt_exec_tree_leaf returns the region the next micro-batch adds into (zeroed: the gradient
 * region for the first); rt_exec_tree_push then folds it into the stack; rt_exec_tree_finish
 * folds what is left, from the right, so that the gradient region holds the step's sum. */
typedef struct RtTree {
    int depth;                 /* partial sums on the stack: tree[0 .. depth-1] */
    int64_t size[RT_TREE_MAX]; /* leaves under each */
} RtTree;
RtStatus rt_exec_tree_open(RtExec *e, int64_t leaves, RtError *err);
RtStatus rt_exec_tree_leaf(RtExec *e, RtTree *t, float **region, RtError *err);
RtStatus rt_exec_tree_push(RtExec *e, RtTree *t, RtError *err);
RtStatus rt_exec_tree_finish(RtExec *e, RtTree *t, RtError *err);
/* The CPU's: the additions rt_exec_tree_push and then rt_exec_tree_finish would make after the
 * leaf at tree[t->depth], over elements [lo, hi) alone, serially, t unchanged (the same additions
 * per element: the same bits). The reduction overlapped with the backward folds each bucket so
 * (docs/parallel.md); the caller then takes the tree as finished. */
void rt_exec_tree_fold_range(RtExec *e, const RtTree *t, int64_t lo, int64_t hi);
/* dst[i] += src[i] for i < n on the host, split over the pool (each element by one thread). */
void rt_host_add(RtPool *pool, float *dst, const float *src, int64_t n);
RtStatus rt_exec_init_params(RtExec *e, uint64_t seed, RtError *err); /* every parameter from its initialiser */
RtDeviceWant rt_device_want(const RtOptions *o);                      /* --device as rt_exec_open takes it */
void rt_print_device(const RtOptions *o, const RtExec *x);            /* the `device:` line of a command's header */

int rt_cmd_train(const RtProgram *p, const RtOptions *o);    /* exit status */
int rt_cmd_eval(const RtProgram *p, const RtOptions *o);     /* exit status */
int rt_cmd_generate(const RtProgram *p, const RtOptions *o); /* exit status (generate.c) */

/* ==== progress and the JSONL log (log.c) ===================================================== */

/* One optimizer step as logged. */
typedef struct RtStepLog {
    int64_t step;     /* 1-based: the step just done */
    double loss;      /* its loss (the global batch's mean) */
    double lr;        /* the learning rate it used */
    double grad_norm; /* the gradient's global L2 norm before clipping */
    double ms;        /* its wall time */
    int64_t tokens;   /* tokens it consumed */
} RtStepLog;

typedef struct RtLog {
    FILE *out;   /* progress (stdout) */
    int tty;     /* out is a terminal: one line redrawn in place */
    FILE *jsonl; /* --log, or NULL */
    const char *jsonl_path;
    int64_t total_steps;
    double t_start;   /* monotonic seconds at rt_log_open */
    double last_draw; /* when the terminal line was last redrawn */
    double timed_ms;  /* wall time of the steps after the first (ETA) */
    int64_t timed_steps;
    int line_open; /* a terminal line is showing without its newline */
} RtLog;

RtStatus rt_log_open(RtLog *l, FILE *out, int tty, const char *jsonl_path, int64_t resumed_step, int64_t total_steps,
                     RtError *err); /* resumed_step >= 0: a resumed run keeps the file's lines up to that step and adds to it */
RtStatus rt_log_step(RtLog *l, const RtStepLog *s, RtError *err);                         /* a step: the line, the JSON object */
RtStatus rt_log_eval(RtLog *l, int64_t step, double loss, int64_t batches, RtError *err); /* a val loss, on its own line */
struct RtCkptDone;
RtStatus rt_log_checkpoint(RtLog *l, const struct RtCkptDone *d, double waited_s,
                           RtError *err);      /* a written checkpoint: a line, a JSON object */
RtStatus rt_log_close(RtLog *l, RtError *err); /* ends the line, closes the file */
double rt_now(void);                           /* monotonic seconds */

/* ==== weights (weights.c) ==================================================================== */

/* Reads every parameter of p by its dotted name from a safetensors file (F32, F16, BF16 or F64,
 * converted to f32); a missing tensor or a shape mismatch is an error. *unused counts the file's
 * tensors that are not parameters of p (the caller may mention them). */
RtStatus rt_weights_load(const RtProgram *p, float *params, const char *path, int64_t *unused, RtError *err);
/* Writes every parameter as F32 under its dotted name, metadata {"format": "pt"}, atomically. */
RtStatus rt_weights_save(const RtProgram *p, const float *params, const char *path, RtError *err);
/* The nn.LoRALinear adapters alone, as PEFT saves them: DIR/adapter_model.safetensors holds each
 * layer's lora_A.weight and lora_B.weight under "base_model.model." and the layer's path, and
 * DIR/adapter_config.json is the program's (RtTrainSettings.adapter_config). With
 * nn.MultiLoRALinear layers of N adapters, DIR/adapter_K (K < N) is adapter K's such directory
 * (its slices of the stacked weights). DIR is created when missing (its parent must exist);
 * *ntensors is how many tensors were written in all. */
RtStatus rt_adapter_save(const RtProgram *p, const float *params, const char *dir, int64_t *ntensors, RtError *err);
/* Why --save-adapter cannot be carried out when RtTrainSettings.adapter_config is NULL. */
RtStatus rt_adapter_refusal(const RtProgram *p, RtError *err);

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
    uint64_t seed; /* the run's: with step 0 and each micro-batch's index, dropout's key */
} RtStepDump;
RtStatus rt_step_dump(const RtProgram *p, const RtStepDump *d, const char *path, RtError *err);

/* ==== checkpoints (checkpoint.c) ============================================================= */

/* A checkpoint is a directory DIR/step-NNNNNNNN (the optimizer steps done, 8 digits or more):
 *   model.safetensors      every parameter, F32, by its dotted name (a weights file, as --save-weights)
 *   optimizer.safetensors  every optimizer state variable, F32, as "<param>.<var>" ("h.0.attn.c_attn.weight.m")
 *   state.json             the step, the seed, the data and schedule positions, the program's hash and
 *                          layout, and each file's size and XXH3-128 checksum
 * and DIR/latest holds the name of the newest complete one and the checksum of its state.json. See docs/runtime.md, "Checkpoints". */

/* What a checkpoint holds besides the regions. */
typedef struct RtCkptInfo {
    int64_t step;          /* optimizer steps done: training goes on with 0-based step `step` */
    uint64_t seed;         /* the run's seed (every random draw is keyed by it and by counters) */
    RtDataPos data;        /* the training split's position after that step */
    double loss;           /* that step's loss (for the log) */
    double lr;             /* the learning rate that step used (for the log) */
    int64_t global, accum; /* the batch ramp's stage for the next step (state.json's "schedule") */
    const char *device;    /* "cpu" or "cuda": where it was trained (a checkpoint resumes on either) */
    int64_t ndata;         /* rt_ckpt_load: the training files it was trained on, in order */
    struct RtCkptData {
        int64_t bytes;
        char sample[RT_CHECKSUM_CHARS]; /* rt_checksum_sample */
        char *path;
    } *data_files;
} RtCkptInfo;

/* The outcome of one checkpoint write (rt_ckpt_poll). */
typedef struct RtCkptDone {
    int64_t step;
    RtStatus status; /* RT_OK, or the failure, described in err */
    RtError err;
    int64_t bytes;   /* written */
    double write_s;  /* from the snapshot to the `latest` pointer */
    char path[4096]; /* the checkpoint's directory */
} RtCkptDone;

typedef struct RtCkptWriter RtCkptWriter;

/* At the start of a run, before any step: DIR must be a directory or creatable (a regular file is
 * refused; with required, so is a location that cannot be created or locked), and when it exists its lock
 * (DIR/.lock, flock) is taken now and held in *lock_fd (-1 when DIR does not exist yet), so that a
 * directory another live run writes is refused at once, naming it. */
RtStatus rt_ckpt_dir_claim(const char *dir, int required, int *lock_fd, RtError *err);
/* Creates DIR if need be, takes its lock (one run writes a directory at a time; lock_fd: the lock
 * rt_ckpt_dir_claim took, which the writer now owns and closes, or -1) and removes the leftovers of
 * interrupted writes. keep: the newest N checkpoints are kept (0: all). */
RtStatus rt_ckpt_writer_open(RtCkptWriter **out, const RtProgram *p, const char *dir, int64_t keep, int async,
                             const RtData *train, int lock_fd, RtError *err); /* train: the files the checkpoints record */
/* Copies the regions into the writer's snapshot (waiting first for a write still under way) and
 * writes the checkpoint: in a background thread when async, else before returning. *waited_s:
 * how long the caller was held. A write's outcome is reported by rt_ckpt_poll, never here. */
RtStatus rt_ckpt_save(RtCkptWriter *w, RtPool *pool, const float *params, const float *state, const RtCkptInfo *info,
                      double *waited_s, RtError *err);
/* 1 and *d when a write has finished that was not reported yet (the oldest first); with wait,
 * waits for the one under way. 0 when there is nothing to report. Call it until it returns 0
 * before each rt_ckpt_save, so that no result is lost. */
int rt_ckpt_poll(RtCkptWriter *w, int wait, RtCkptDone *d);
void rt_ckpt_writer_close(RtCkptWriter *w); /* waits for the write under way, releases the lock; NULL is fine */

/* The checkpoint `arg` names: "latest" (DIR/latest), a checkpoint root holding a `latest` file, or
 * a step directory. A `latest` is followed only when the state.json it names has the checksum it
 * records. *path is malloc'd. */
RtStatus rt_ckpt_resolve(const char *arg, const char *dir, char **path, RtError *err);
/* Reads state.json and checks every file's checksum; then, unless weights_only, checks that the
 * checkpoint is of this program (hash, batch layout, parameters, optimizer state) - a mismatch is
 * one message listing what differs - and reads the parameters, the optimizer state (state may be
 * NULL with weights_only) and *info. */
RtStatus rt_ckpt_load(const RtProgram *p, const char *path, int weights_only, float *params, float *state, RtCkptInfo *info,
                      RtError *err);
/* The training files are those the checkpoint was trained on (sizes and sampled checksums; paths may differ). */
RtStatus rt_ckpt_check_data(const RtCkptInfo *info, const char *path, const RtData *train, RtError *err);
void rt_ckpt_info_free(RtCkptInfo *info); /* the data file list */

/* ==== sampling (generate.c) ================================================================== */

/* The next token from logits[0, vocab): the largest (lowest id on ties) when temperature is 0 or
 * top_k is 1; otherwise softmax(logits / temperature) over the top_k largest (0: all; ties by
 * lower id), sampled by inverting its CDF at u in [0, 1). scratch holds 8 x vocab bytes. */
/* One token from logits: greedy when temperature is 0 or top_k is 1; else softmax(logits / T)
 * over the top_k likeliest (0: all), then the smallest set of the likeliest whose probability
 * reaches top_p (1: all), drawn by inverse CDF at u in [0, 1). scratch holds vocab candidates
 * (RT_SAMPLE_SCRATCH bytes each). */
#define RT_SAMPLE_SCRATCH 8
int32_t rt_sample_token(const float *logits, int64_t vocab, double temperature, int64_t top_k, double top_p, double u,
                        void *scratch);
/* The uniform that samples the token at 0-based position pos of a sequence under seed: the first
 * 53-bit draw of Philox stream pos of the `samp` domain, so a token depends on (seed, position)
 * alone - not on the batch, the thread count or what was sampled before (generate and serve). */
double rt_sample_u(uint64_t seed, int64_t pos);
int rt_cmd_serve(const RtProgram *p, const RtOptions *o); /* `PROG serve` (runtime/serve/server.c): exit status */

#endif
