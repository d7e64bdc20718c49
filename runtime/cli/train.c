/* train.c - the executable's driver: rt_main, the memory of a run, the train loop and evaluation
 * (see rt_exec.h; docs/runtime.md, "The train loop").
 *
 * Pipeline position: the top of every executable. runtime/main.c hands rt_main the program's
 * descriptor (rt_program.h); rt_main checks it, parses the command line (cli.c) and runs a
 * command. Training, per optimizer step:
 *
 *     lr = base lr x lr_schedule(step); (global, accum) = the step's batch-ramp stage
 *     for each of the accum x data_ranks micro-batches: read B windows, forward_backward (adds
 *         grad(loss) / (accum x data_ranks) into the gradient region; the step's loss is the mean of theirs)
 *     norm = the global L2 norm of the gradient region; if clip > 0 and norm > clip, scale it
 *     optimizer_update(lr, t = step + 1); zero the gradients; log
 *
 * Determinism: initialisation is a function of (seed, name, element); the data order of (seed,
 * epoch); every parallel loop gives each element to one thread; the gradient norm sums fixed
 * blocks in block order. So a run is a function of its program, flags and data, never of the
 * thread count (tests/unit/test_rt_train.c compares weights files byte for byte). */
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_exec.h"
#include "rt_profile.h"

/* ---- the descriptor ----------------------------------------------------------------------------- */

static int rt_cmp_param_offset(const void *a, const void *b) {
    const RtParam *x = *(const RtParam *const *)a, *y = *(const RtParam *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

RtStatus rt_program_check(const RtProgram *p, RtError *err) {
    if (!p) return rt_fail(err, RT_ERR_ARG, "no program descriptor");
    if (p->abi_version != RT_ABI_VERSION)
        return rt_fail(err, RT_ERR_ARG, "the program was compiled for runtime ABI %d but this runtime is ABI %d (rebuild it)",
                       p->abi_version, RT_ABI_VERSION);
    const RtTrainSettings *t = &p->train;
    if (!t->name || !*t->name) return rt_fail(err, RT_ERR_ARG, "the train block has no name");
    if (t->micro < 1 || t->seq < 1 || t->accum < 1 || t->data_ranks < 1 || t->global / t->micro / t->data_ranks != t->accum ||
        t->global != t->micro * t->accum * t->data_ranks)
        return rt_fail(err, RT_ERR_ARG, "batch: global %lld is not micro %lld x accumulation %lld x data %lld (seq %lld)",
                       (long long)t->global, (long long)t->micro, (long long)t->accum, (long long)t->data_ranks,
                       (long long)t->seq);
    if (t->nramp < 0 || (t->nramp > 0 && !t->ramp))
        return rt_fail(err, RT_ERR_ARG, "batch: nramp is %lld (it must be 0 or more, with a ramp table when above 0)",
                       (long long)t->nramp);
    for (int64_t i = 0; i < t->nramp; i++) {
        const RtRampStage *r = &t->ramp[i];
        int64_t prev = i > 0 ? t->ramp[i - 1].step : 0;
        if (r->step <= prev)
            return rt_fail(err, RT_ERR_ARG, "batch: ramp stage %lld starts at step %lld, not after step %lld", (long long)(i + 1),
                           (long long)r->step, (long long)prev);
        if (r->accum < 1)
            return rt_fail(err, RT_ERR_ARG, "batch: ramp stage %lld (step %lld) has accumulation %lld", (long long)(i + 1),
                           (long long)r->step, (long long)r->accum);
        if (r->global / t->micro / t->data_ranks != r->accum || r->global != t->micro * r->accum * t->data_ranks)
            return rt_fail(err, RT_ERR_ARG,
                           "batch: ramp stage %lld (step %lld): global %lld is not micro %lld x accumulation %lld x data %lld",
                           (long long)(i + 1), (long long)r->step, (long long)r->global, (long long)t->micro, (long long)r->accum,
                           (long long)t->data_ranks);
    }
    if (t->steps < 0 || t->vocab < 1 || t->vocab > INT32_MAX || t->ctx < 0)
        return rt_fail(err, RT_ERR_ARG, "steps %lld, vocab %lld or ctx %lld out of range", (long long)t->steps,
                       (long long)t->vocab, (long long)t->ctx);
    if (!isfinite(t->lr) || !isfinite(t->clip) || t->clip < 0)
        return rt_fail(err, RT_ERR_ARG, "lr %g or clip %g is not a finite number (clip >= 0)", t->lr, t->clip);
    if (!t->data || !*t->data) return rt_fail(err, RT_ERR_ARG, "the train block has no data glob");
    if (t->eval_every < 0 || t->eval_steps < 1)
        return rt_fail(err, RT_ERR_ARG, "eval every %lld, steps %lld out of range", (long long)t->eval_every,
                       (long long)t->eval_steps);
    if (p->generate.max_tokens < 0 || p->generate.top_k < 0 || !(p->generate.temperature >= 0))
        return rt_fail(err, RT_ERR_ARG, "generation defaults out of range");
    if (!p->forward_backward || !p->optimizer_update || !p->lr_schedule)
        return rt_fail(err, RT_ERR_ARG, "forward_backward, optimizer_update or lr_schedule is missing");
    if (p->nparams < 0 || (p->nparams > 0 && !p->params) || p->param_floats < 0 || p->state_floats < 0 || p->arena_bytes < 0 ||
        (p->forward_logits && p->logits_seq < 1))
        return rt_fail(err, RT_ERR_ARG, "a region size or the parameter count is negative");
    /* the state region: nstate parts of at most the parameter region each (rt_state_part); with no
     * named state variable it is the program's own (nothing of it is checkpointed) */
    if (p->nstate < 0 || (p->nstate > 0 && (p->state_floats % p->nstate != 0 || rt_state_part(p) > p->param_floats)))
        return rt_fail(err, RT_ERR_ARG, "the optimizer-state region (%lld floats) is not %lld parts of the parameter region",
                       (long long)p->state_floats, (long long)p->nstate);
    const RtParam **byoff = calloc(p->nparams > 0 ? (size_t)p->nparams : 1, sizeof *byoff);
    if (!byoff) return rt_fail_errno(err, ENOMEM, "cannot check the parameter table");
    RtStatus st = RT_OK;
    for (int64_t i = 0; st == RT_OK && i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        byoff[i] = q;
        if (!q->name || !*q->name) {
            st = rt_fail(err, RT_ERR_ARG, "parameter %lld has no name", (long long)i);
            break;
        }
        if (q->rank < 0 || q->rank > RT_ST_MAX_RANK) {
            st = rt_fail(err, RT_ERR_ARG, "parameter '%s' has rank %d", q->name, q->rank);
            break;
        }
        int64_t n = 1;
        for (int d = 0; d < q->rank && st == RT_OK; d++) {
            if (q->shape[d] < 0 || (q->shape[d] > 0 && n > INT64_MAX / q->shape[d]))
                st = rt_fail(err, RT_ERR_ARG, "parameter '%s' has a bad dimension %lld", q->name, (long long)q->shape[d]);
            else n *= q->shape[d];
        }
        if (st != RT_OK) break;
        if (n != q->numel || q->offset < 0 || q->offset > p->param_floats - q->numel) {
            st = rt_fail(err, RT_ERR_ARG, "parameter '%s': %lld elements at offset %lld (shape gives %lld; the region has %lld)",
                         q->name, (long long)q->numel, (long long)q->offset, (long long)n, (long long)p->param_floats);
            break;
        }
        for (int64_t j = 0; j < i; j++)
            if (strcmp(p->params[j].name, q->name) == 0) {
                st = rt_fail(err, RT_ERR_ARG, "two parameters are named '%s'", q->name);
                break;
            }
    }
    if (st == RT_OK && p->nparams > 1) {
        qsort(byoff, (size_t)p->nparams, sizeof *byoff, rt_cmp_param_offset);
        for (int64_t i = 1; i < p->nparams; i++)
            if (byoff[i - 1]->offset + byoff[i - 1]->numel > byoff[i]->offset) {
                st = rt_fail(err, RT_ERR_ARG, "parameters '%s' and '%s' overlap in the parameter region", byoff[i - 1]->name,
                             byoff[i]->name);
                break;
            }
    }
    free(byoff);
    return st;
}

/* ---- parameters --------------------------------------------------------------------------------- */

/* Initialisation in blocks of RT_INIT_BLOCK elements over all parameters: each element's value
 * depends only on (seed, name, index), so the blocks may run on any thread. */
#define RT_INIT_BLOCK 65536

typedef struct RtInitJob {
    const RtProgram *p;
    float *params;
    uint64_t seed;
    int64_t *first_block; /* first_block[i]: the first block of parameter i; [nparams]: the total */
} RtInitJob;

static void rt_init_blocks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtInitJob *j = ctx;
    int64_t i = 0;
    for (int64_t blk = begin; blk < end; blk++) {
        while (j->first_block[i + 1] <= blk) i++;
        const RtParam *q = &j->p->params[i];
        int64_t b = (blk - j->first_block[i]) * RT_INIT_BLOCK;
        int64_t e = b + RT_INIT_BLOCK < q->numel ? b + RT_INIT_BLOCK : q->numel;
        /* cannot fail: the arguments were checked by rt_exec_init_params */
        rt_init_param_range(j->params + q->offset + b, b, e, j->seed, rt_hash_name(q->name), q->init, q->init_a, q->init_b, NULL);
    }
}

RtStatus rt_exec_init_params(RtExec *e, uint64_t seed, RtError *err) {
    const RtProgram *p = e->prog;
    int64_t *first = calloc((size_t)p->nparams + 1, sizeof *first);
    if (!first) return rt_fail_errno(err, ENOMEM, "cannot initialise the parameters");
    for (int64_t i = 0; i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        /* an empty range checks the initialiser's numbers */
        RtStatus st = rt_init_param_range(NULL, 0, 0, seed, 0, q->init, q->init_a, q->init_b, err);
        if (st != RT_OK) {
            free(first);
            return rt_error_context(err, "cannot initialise parameter '%s'", q->name);
        }
        first[i + 1] = first[i] + (q->numel + RT_INIT_BLOCK - 1) / RT_INIT_BLOCK;
    }
    RtInitJob j = {p, e->params, seed, first};
    rt_parallel_for(e->pool, first[p->nparams], rt_init_blocks, &j);
    free(first);
    return RT_OK;
}

RtRampStage rt_train_stage(const RtTrainSettings *t, int64_t step) {
    RtRampStage s = {0, t->global, t->accum};
    for (int64_t i = 0; i < t->nramp && t->ramp[i].step <= step; i++) s = t->ramp[i];
    return s;
}

/* The parameters a command starts from: the weights file, when one is given (a note on stderr
 * counts its tensors that are not parameters), else every initialiser keyed by --seed. */
static RtStatus rt_exec_start_params(RtExec *x, const RtOptions *o, const char *weights, RtError *err) {
    if (!weights) return rt_exec_init_params(x, o->seed, err);
    int64_t unused = 0;
    RtStatus st = rt_weights_load(x->prog, x->params, weights, &unused, err);
    if (st == RT_OK && unused > 0)
        fprintf(stderr, "%s: note: %lld tensors of '%s' are not parameters of this program and were not read\n", o->prog,
                (long long)unused, weights);
    return st;
}

/* ---- evaluation --------------------------------------------------------------------------------- */

/* The mean loss over up to `batches` micro-batches of the held-out split, read from its start
 * (the callers ask for eval_steps global batches of the first ramp stage: eval_steps x global / micro
 * micro-batches). */
static RtStatus rt_evaluate(RtExec *e, RtData *val, int64_t batches, uint64_t seed, double *loss, int64_t *used, RtError *err) {
    const RtProgram *p = e->prog;
    if (!p->forward_loss) return rt_fail(err, RT_ERR_ARG, "this program cannot evaluate: it has no loss-only forward");
    int64_t B = p->train.micro, T = p->train.seq;
    int64_t have = rt_data_windows(val) / B;
    if (have < 1)
        return rt_fail(err, RT_ERR_ARG, "the held-out data have %lld windows of %lld tokens, fewer than one batch of %lld",
                       (long long)rt_data_windows(val), (long long)(T + 1), (long long)B);
    if (batches > have) batches = have;
    rt_data_rewind(val);
    double sum = 0;
    for (int64_t b = 0; b < batches; b++) {
        RtStatus st = rt_data_next(val, B, e->x, e->y, err);
        if (st == RT_OK) st = rt_exec_batch(e, B * T, err);
        if (st != RT_OK) return st;
        RtStep s = rt_exec_step(e, err);
        s.B = B, s.T = T, s.seed = seed;
        st = rt_exec_call(e, RT_EXEC_FORWARD_LOSS, &s);
        if (st != RT_OK) return rt_error_context(err, "evaluation, batch %lld", (long long)(b + 1));
        sum += s.loss;
    }
    *loss = sum / (double)batches;
    *used = batches;
    return RT_OK;
}

/* ---- commands ----------------------------------------------------------------------------------- */

static int rt_report(const RtOptions *o, const RtError *e) {
    fflush(stdout);
    fprintf(stderr, "%s: %s\n", o->prog, e->msg);
    return 1;
}

static RtDataSpec rt_data_spec(const RtProgram *p, const RtOptions *o, const char *train_glob, const char *val_glob) {
    RtDataSpec d = {0};
    d.pattern = train_glob;
    d.val_pattern = val_glob;
    d.seq = p->train.seq;
    d.vocab = p->train.vocab;
    d.shuffle = p->train.shuffle;
    d.seed = o->seed;
    /* Without a val glob the tail of the training data is held out, always, so that `eval`
     * after training reads windows the training never saw: eval_steps global batches, so the
     * split (and the shuffled order of the rest) does not depend on how a global batch is cut
     * into micro-batches. */
    d.val_windows = val_glob && *val_glob ? 0 : p->train.eval_steps * p->train.global;
    return d;
}

static void rt_fmt_int(char *buf, size_t n, int64_t v) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    size_t k = 0;
    for (int i = 0; i < len && k + 1 < n; i++) {
        if (i > 0 && tmp[i - 1] != '-' && (len - i) % 3 == 0 && k + 2 < n) buf[k++] = ',';
        buf[k++] = tmp[i];
    }
    buf[k] = 0;
}

/* ---- stopping on a signal ------------------------------------------------------------------------ */

/* SIGTERM or SIGINT asks the run to stop: the step under way finishes, a checkpoint is written,
 * and the run exits 0. A second signal stops the process at once (the default action). */
static volatile sig_atomic_t rt_stop_signal;

static void rt_on_stop_signal(int sig) {
    rt_stop_signal = sig;
    signal(sig, SIG_DFL);
}

static void rt_stop_handlers(int install, struct sigaction old[2]) {
    static const int sigs[2] = {SIGTERM, SIGINT};
    for (int i = 0; i < 2; i++) {
        if (install) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = rt_on_stop_signal;
            sigemptyset(&sa.sa_mask);
            sa.sa_flags = SA_RESTART;
            sigaction(sigs[i], &sa, &old[i]);
        } else {
            sigaction(sigs[i], &old[i], NULL);
        }
    }
}

/* Reports the checkpoint writes that have finished (all of them with wait). A failed write is an
 * error unless the program says `checkpoint { on_error = "continue" }`, when it is a warning. */
static RtStatus rt_ckpt_report(const RtProgram *p, const RtOptions *o, RtCkptWriter *w, int wait, double waited_s, RtLog *log,
                               RtError *err) {
    RtCkptDone d;
    while (rt_ckpt_poll(w, wait, &d)) {
        if (d.status == RT_OK) {
            RtStatus st = rt_log_checkpoint(log, &d, waited_s, err);
            if (st != RT_OK) return st;
            continue;
        }
        if (!p->train.ckpt_continue_on_error)
            return rt_fail(err, d.status,
                           "checkpoint at step %lld failed: %s; earlier checkpoints are untouched; stopping "
                           "(checkpoint { on_error = \"continue\" } trains on)",
                           (long long)d.step, d.err.msg);
        rt_log_checkpoint(log, &d, waited_s, err);
        fflush(stdout);
        fprintf(stderr, "%s: warning: checkpoint at step %lld failed: %s; earlier checkpoints are untouched; training goes on\n",
                o->prog, (long long)d.step, d.err.msg);
    }
    return RT_OK;
}

/* ---- the train command ------------------------------------------------------------------------- */

/* Everything one training run holds, from rt_train_open to rt_train_close. */
typedef struct RtTrainRun {
    const RtProgram *p;
    const RtOptions *given; /* the options as parsed */
    RtOptions o;            /* the run's: a resumed run takes the checkpoint's seed */
    RtError e;
    RtExec x;
    RtData *train, *val;
    RtDataSpec spec;
    RtLog log;
    int log_open;
    double *partial; /* the gradient norm's blocks */
    RtProfile *prof; /* MBT_PROFILE=1: where the step time goes (rt_profile.h) */
    RtCkptWriter *ckpt;
    RtCkptInfo resumed;
    char *resume_path;
    struct sigaction old_handlers[2];
    int handlers;
    /* --dump-step keeps step 1's batches (micro-batch after micro-batch), and its parameters and
     * gradients as they were before clipping and the update */
    int32_t *dump_x, *dump_y;
    float *dump_p, *dump_g;
    int64_t window; /* tokens of one micro-batch */
    double waited;  /* training's wait for the last checkpoint snapshot */
    int ckpt_lock;  /* the checkpoint directory's lock, until the writer takes it; -1: none */
} RtTrainRun;

/* ---- the run's outputs, checked before anything runs ---------------------------------------------- */

static int rt_same_file(const struct stat *a, const char *path) {
    struct stat b;
    return path && stat(path, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

/* Which input of the run the existing file `so` is (into buf), or NULL: the program itself, the
 * training and held-out data, --init-weights, the checkpoint resumed from. */
static const char *rt_output_clash(const RtTrainRun *r, const struct stat *so, char *buf, size_t n) {
    if (rt_same_file(so, "/proc/self/exe")) return "this program's executable";
    for (int k = 0; k < 2; k++) {
        const RtData *d = k ? r->val : r->train;
        for (int64_t i = 0; d && i < rt_data_nfiles(d); i++)
            if (rt_same_file(so, rt_data_file(d, i))) {
                snprintf(buf, n, "the %s data file '%.3000s'", k ? "held-out" : "training", rt_data_file(d, i));
                return buf;
            }
    }
    const char *val = r->p->train.val_data;
    glob_t g;
    if (!r->val && val && *val && glob(val, 0, NULL, &g) == 0) { /* the held-out files, when this run does not read them */
        const char *hit = NULL;
        for (size_t i = 0; !hit && i < g.gl_pathc; i++)
            if (rt_same_file(so, g.gl_pathv[i])) hit = buf, snprintf(buf, n, "the held-out data file '%.3000s'", g.gl_pathv[i]);
        globfree(&g);
        if (hit) return hit;
    }
    if (rt_same_file(so, r->o.init_weights)) return "the --init-weights file";
    static const char *const ckpt_files[] = {"model.safetensors", "optimizer.safetensors", "state.json"};
    for (int i = 0; r->resume_path && i < 3; i++) {
        snprintf(buf, n, "%.3000s/%s", r->resume_path, ckpt_files[i]);
        if (rt_same_file(so, buf)) {
            snprintf(buf, n, "a file of the checkpoint '%.3000s'", r->resume_path);
            return buf;
        }
    }
    return NULL;
}

/* A file the run writes (--save-weights at its end, --log, --dump-step) is checked now, so that a
 * mistake costs a second, not the whole run or an input: not a directory, not an input of the
 * run, not another output, writable, and (what: the file's name in the message; NULL when the
 * caller opens it before the first step anyway) in a writable directory. */
static RtStatus rt_check_output(const RtTrainRun *r, const char *path, const char *flag, const char *what, RtError *err) {
    const RtOptions *o = &r->o;
    const char *outs[3] = {o->save_weights, o->log_path, o->dump_step}, *flags[3] = {"--save-weights", "--log", "--dump-step"};
    struct stat so;
    char buf[4096];
    int exists = stat(path, &so) == 0;
    if (exists) {
        if (S_ISDIR(so.st_mode))
            return rt_fail(err, RT_ERR_ARG, "%s '%s' is a directory: give the path of the file to write", flag, path);
        const char *clash = rt_output_clash(r, &so, buf, sizeof buf);
        if (clash)
            return rt_fail(err, RT_ERR_ARG, "%s '%s' is %s, which the run reads: writing it would destroy it", flag, path, clash);
        if (access(path, W_OK) != 0) return rt_fail_errno(err, errno, "cannot write %s '%s'", flag, path);
    }
    for (int i = 0; i < 3; i++)
        if (outs[i] && outs[i] != path && (strcmp(outs[i], path) == 0 || (exists && rt_same_file(&so, outs[i]))))
            return rt_fail(err, RT_ERR_ARG, "%s and %s name the same file '%s'", flag, flags[i], path);
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, sizeof buf, ".");
    else if (slash == path) snprintf(buf, sizeof buf, "/");
    else snprintf(buf, sizeof buf, "%.*s", (int)(slash - path), path);
    if (what && access(buf, W_OK | X_OK) != 0)
        return rt_fail_errno(err, errno, "cannot write the %s '%s': directory '%s'", what, path, buf);
    return RT_OK;
}

/* Every output of the run, and the checkpoint directory (a file, or one another run holds, is
 * refused now; its lock is held from here to the end of the run). */
static RtStatus rt_check_outputs(RtTrainRun *r) {
    const RtOptions *o = &r->o;
    RtStatus st = o->save_weights ? rt_check_output(r, o->save_weights, "--save-weights", "weights file", &r->e) : RT_OK;
    /* the log's directory: rt_log_open, below, opens it before the first step */
    if (st == RT_OK && o->log_path) st = rt_check_output(r, o->log_path, "--log", NULL, &r->e);
    if (st == RT_OK && o->dump_step) st = rt_check_output(r, o->dump_step, "--dump-step", "step dump", &r->e);
    if (st == RT_OK && o->save_adapter) { /* a directory, made at the end if missing: its parent must be writable now */
        struct stat sd;
        char parent[4096];
        const char *slash = strrchr(o->save_adapter, '/');
        if (stat(o->save_adapter, &sd) == 0) {
            if (!S_ISDIR(sd.st_mode)) st = rt_fail(&r->e, RT_ERR_ARG, "--save-adapter '%s' is not a directory", o->save_adapter);
            else if (access(o->save_adapter, W_OK | X_OK) != 0)
                st = rt_fail_errno(&r->e, errno, "cannot write in --save-adapter '%s'", o->save_adapter);
        } else {
            if (!slash) snprintf(parent, sizeof parent, ".");
            else if (slash == o->save_adapter) snprintf(parent, sizeof parent, "/");
            else snprintf(parent, sizeof parent, "%.*s", (int)(slash - o->save_adapter), o->save_adapter);
            if (access(parent, W_OK | X_OK) != 0)
                st = rt_fail_errno(&r->e, errno, "cannot create --save-adapter '%s' in directory '%s'", o->save_adapter, parent);
        }
    }
    int required = o->ckpt_every > 0 || strcmp(o->ckpt_dir, o->ckpt_dir_default) != 0;
    if (st == RT_OK) st = rt_ckpt_dir_claim(o->ckpt_dir, required, &r->ckpt_lock, &r->e);
    return st;
}

/* Resumes from --resume or --resume-weights-only: the parameters (and the optimizer state and the
 * seed with --resume) from the checkpoint. */
static RtStatus rt_train_resume(RtTrainRun *r, const char *arg) {
    RtOptions *o = &r->o;
    RtStatus st = rt_ckpt_resolve(arg, o->ckpt_dir, &r->resume_path, &r->e);
    if (st == RT_OK) st = rt_ckpt_load(r->p, r->resume_path, !o->resume, r->x.params, r->x.state, &r->resumed, &r->e);
    if (st == RT_OK && o->resume) {
        if (o->seed_given && o->seed != r->resumed.seed)
            st = rt_fail(&r->e, RT_ERR_ARG,
                         "--seed %llu, but checkpoint '%s' was trained with seed %llu (leave --seed out to resume)",
                         (unsigned long long)o->seed, r->resume_path, (unsigned long long)r->resumed.seed);
        o->seed = r->resumed.seed;
    }
    return st;
}

/* The data: both splits open, the training split where a resumed run left it. */
static RtStatus rt_train_data(RtTrainRun *r) {
    const RtProgram *p = r->p;
    const RtOptions *o = &r->o;
    r->spec = rt_data_spec(p, o, o->data ? o->data : p->train.data, p->train.val_data);
    RtStatus st = rt_data_open(&r->train, &r->spec, RT_SPLIT_TRAIN, &r->e);
    if (st == RT_OK && p->train.eval_every > 0) st = rt_data_open(&r->val, &r->spec, RT_SPLIT_VAL, &r->e);
    if (st == RT_OK && o->resume) st = rt_ckpt_check_data(&r->resumed, r->resume_path, r->train, &r->e);
    if (st == RT_OK && o->resume) {
        st = rt_data_seek(r->train, &r->resumed.data, &r->e);
        if (st != RT_OK)
            rt_error_context(&r->e, "checkpoint '%s': the training data are not those it was trained on", r->resume_path);
    }
    return st;
}

/* The buffers --dump-step fills during step 1. */
static RtStatus rt_train_dump_alloc(RtTrainRun *r) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    RtStatus st = RT_OK;
    r->dump_x = calloc((size_t)(t->accum * t->data_ranks * r->window), sizeof *r->dump_x); /* step 1's micro-batches */
    r->dump_y = calloc((size_t)(t->accum * t->data_ranks * r->window), sizeof *r->dump_y);
    r->dump_p = calloc((size_t)p->param_floats + 1, sizeof *r->dump_p);
    r->dump_g = calloc((size_t)p->param_floats + 1, sizeof *r->dump_g);
    if (st == RT_OK && (!r->dump_x || !r->dump_y || !r->dump_p || !r->dump_g))
        st = rt_fail_errno(&r->e, ENOMEM, "cannot hold the step to dump");
    if (st == RT_OK && r->o.steps < 1) st = rt_fail(&r->e, RT_ERR_ARG, "--dump-step needs at least one step (--steps 0)");
    return st;
}

/* Everything before the first step: the device, a resumed checkpoint, the data, the parameters
 * and the optimizer state on the device, the checkpoint writer and the log. */
static RtStatus rt_train_open(RtTrainRun *r) {
    const RtProgram *p = r->p;
    const RtOptions *o = &r->o;
    const char *resume_arg = o->resume ? o->resume : o->resume_weights_only;
    RtStatus st = rt_exec_open(&r->x, p, o->threads, rt_device_want(o), &r->e);
    if (st == RT_OK && resume_arg) st = rt_train_resume(r, resume_arg);
    if (st == RT_OK) st = rt_train_data(r);
    if (st == RT_OK) st = rt_check_outputs(r);
    if (st == RT_OK && rt_profile_requested()) {
        r->prof = calloc(1, sizeof *r->prof);
        if (!r->prof) st = rt_fail_errno(&r->e, ENOMEM, "cannot allocate the profile");
    }
    if (st == RT_OK && !resume_arg) st = rt_exec_start_params(&r->x, o, o->init_weights, &r->e);
    if (st == RT_OK && p->optimizer_init && !o->resume) { /* on the host; pushed below */
        RtStep s = {
            .pool = r->x.pool, .params = r->x.params, .grads = r->x.grads, .state = r->x.state, .seed = o->seed, .err = &r->e};
        st = p->optimizer_init(&s);
        if (st != RT_OK) rt_error_context(&r->e, "initialising the optimizer state");
    }
    if (st == RT_OK) st = rt_exec_push(&r->x, &r->e);
    int64_t nblocks = rt_exec_grad_blocks(p);
    if (st == RT_OK) {
        r->partial = calloc(nblocks > 0 ? (size_t)nblocks : 1, sizeof *r->partial);
        if (!r->partial) st = rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient-norm blocks");
    }
    if (st == RT_OK && o->dump_step) st = rt_train_dump_alloc(r);
    if (st == RT_OK && o->ckpt_every > 0) {
        st = rt_ckpt_writer_open(&r->ckpt, p, o->ckpt_dir, o->ckpt_keep, !o->ckpt_sync, r->train, r->ckpt_lock, &r->e);
        r->ckpt_lock = -1; /* the writer's now */
    }
    if (st == RT_OK)
        st = rt_log_open(&r->log, stdout, isatty(fileno(stdout)), o->log_path, o->resume ? r->resumed.step : -1, o->steps, &r->e);
    if (st == RT_OK) r->log_open = 1;
    return st;
}

/* The run's header: the model and batch, the ramp, the device, the data, where it resumes. */
static void rt_train_banner(const RtTrainRun *r) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    const RtOptions *o = &r->o;
    char nparam[32];
    rt_fmt_int(nparam, sizeof nparam, p->param_floats);
    char data_ranks[48] = "";
    if (t->data_ranks > 1) snprintf(data_ranks, sizeof data_ranks, " x %lld data ranks", (long long)t->data_ranks);
    printf("train %s: %s parameters in %lld tensors; %lld steps of %lld sequences x %lld tokens (micro-batch %lld, "
           "accumulation %lld%s%s); seed %llu\n",
           t->name, nparam, (long long)p->nparams, (long long)o->steps, (long long)t->global, (long long)t->seq,
           (long long)t->micro, (long long)t->accum, data_ranks, t->nramp > 0 ? ", then ramped" : "",
           (unsigned long long)o->seed);
    for (int64_t i = 0; i < t->nramp; i++)
        printf("batch ramp: from step %lld, %lld sequences a step (accumulation %lld)%s\n", (long long)(t->ramp[i].step + 1),
               (long long)t->ramp[i].global, (long long)t->ramp[i].accum,
               t->ramp[i].step >= o->steps ? "; not reached in this run" : "");
    if (t->data_ranks > 1)
        printf("data-parallel: the program's %lld data ranks run in this one process, one after another: "
               "%lld micro-batches of %lld a step, the whole global batch\n",
               (long long)t->data_ranks, (long long)(t->accum * t->data_ranks), (long long)t->micro);
    rt_print_device(o, &r->x);
    printf("data: %lld windows in %lld file%s ('%s')\n", (long long)rt_data_windows(r->train),
           (long long)rt_data_nfiles(r->train), rt_data_nfiles(r->train) == 1 ? "" : "s", r->spec.pattern);
    const char *left_out = NULL;
    int64_t nleft_out = rt_data_left_out(r->train, &left_out);
    if (nleft_out > 0)
        printf("data: left out %lld held-out file%s the glob also matches ('%s'%s): not trained on; a glob of its own "
               "trains on it\n",
               (long long)nleft_out, nleft_out == 1 ? "" : "s", left_out, nleft_out > 1 ? ", ..." : "");
    if (r->resume_path && o->resume)
        printf("resumed from '%s': step %lld done (loss %.6f); training goes on to step %lld\n", r->resume_path,
               (long long)r->resumed.step, r->resumed.loss, (long long)o->steps);
    else if (r->resume_path)
        printf("weights from checkpoint '%s'; the optimizer, the step and the data start afresh\n", r->resume_path);
    if (r->ckpt)
        printf("checkpoints: every %lld steps to '%s'%s, %s\n", (long long)o->ckpt_every, o->ckpt_dir,
               o->ckpt_keep ? "" : ", all kept", o->ckpt_sync ? "written before training goes on" : "written in the background");
    fflush(stdout);
}

/* One step's micro-batches: forward and backward of each, adding into the gradients; *loss is
 * the step's (the mean of theirs). Each next batch is read while the GPU runs the one before
 * (exec.c: the GPU has two pairs of batch buffers). */
static RtStatus rt_train_micro_batches(RtTrainRun *r, int64_t step, int64_t nmicro, double *loss) {
    const RtTrainSettings *t = &r->p->train;
    RtExec *x = &r->x;
    RtError enext;
    RtStatus next = rt_data_next(r->train, t->micro, x->x, x->y, &enext);
    *loss = 0;
    for (int64_t m = 0; m < nmicro; m++) {
        RtStatus st = next;
        if (st != RT_OK) r->e = enext;
        if (st == RT_OK) st = rt_exec_batch(x, r->window, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld", (long long)(step + 1));
        if (r->dump_x && step == 0) {
            memcpy(r->dump_x + m * r->window, x->x, (size_t)r->window * sizeof *r->dump_x);
            memcpy(r->dump_y + m * r->window, x->y, (size_t)r->window * sizeof *r->dump_y);
        }
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_DATA);
        RtStep s = rt_exec_step(x, &r->e);
        s.B = t->micro, s.T = t->seq, s.loss_scale = 1.0 / (double)nmicro, s.step = step, s.micro = m, s.seed = r->o.seed;
        st = rt_exec_queue(x, RT_EXEC_FORWARD_BACKWARD, &s);
        if (st == RT_OK && m + 1 < nmicro) {
            rt_exec_flip(x);
            next = rt_data_next(r->train, t->micro, x->x, x->y, &enext);
        }
        if (st == RT_OK) st = rt_exec_wait(x, &r->e); /* s.loss is set */
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld, micro-batch %lld", (long long)(step + 1), (long long)(m + 1));
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_FB);
        if (!isfinite(s.loss))
            return rt_fail(&r->e, RT_ERR_ARG, "step %lld, micro-batch %lld: the loss is %s; stopping", (long long)(step + 1),
                           (long long)(m + 1),
                           isnan(s.loss) ? "nan"
                           : s.loss > 0  ? "inf"
                                         : "-inf");
        *loss += s.loss * s.loss_scale;
    }
    return RT_OK;
}

/* One optimizer step: its micro-batches, the gradient norm and clipping, the update, and with
 * --dump-step the dump of step 1. The step's log record comes back in *sl. */
static RtStatus rt_train_step(RtTrainRun *r, int64_t step, RtStepLog *sl) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    RtExec *x = &r->x;
    double t0 = rt_now();
    /* this step's batch: its ramp stage; all data ranks' micro-batches run here, in turn */
    RtRampStage stage = rt_train_stage(t, step);
    int64_t nmicro = stage.accum * t->data_ranks;
    double mult = p->lr_schedule(step), lr = t->lr * mult, loss = 0, norm = 0;
    if (!isfinite(lr))
        return rt_fail(&r->e, RT_ERR_ARG, "step %lld: the learning-rate schedule gave %g", (long long)(step + 1), mult);
    RtStatus st = rt_train_micro_batches(r, step, nmicro, &loss);
    if (st == RT_OK && r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS | RT_PULL_GRADS, &r->e);
        if (st != RT_OK) return st;
        memcpy(r->dump_p, x->params, (size_t)p->param_floats * sizeof *r->dump_p);
        memcpy(r->dump_g, x->grads, (size_t)p->param_floats * sizeof *r->dump_g);
    }
    if (st != RT_OK) return st;
    st = rt_exec_grad_norm(x, r->partial, &norm, &r->e);
    if (st == RT_OK && t->clip > 0 && t->clip / (norm + RT_CLIP_EPS) < 1)
        st = rt_exec_grad_scale(x, (float)(t->clip / (norm + RT_CLIP_EPS)), &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient norm", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_NORM);
    RtStep s = rt_exec_step(x, &r->e);
    s.lr = lr, s.t = step + 1, s.step = step, s.seed = r->o.seed;
    st = rt_exec_call(x, RT_EXEC_UPDATE, &s);
    if (st == RT_OK) st = rt_exec_grad_zero(x, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: optimizer", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_UPDATE);
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_ZERO);
    if (r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS, &r->e);
        if (st != RT_OK) return st;
        RtStepDump d = {r->dump_p, r->dump_g, x->params, r->dump_x, r->dump_y, nmicro, loss, lr, t->clip};
        st = rt_step_dump(p, &d, r->o.dump_step, &r->e);
        if (st != RT_OK) return st;
        printf("wrote step 1 (loss %.9g, %lld micro-batch%s) to '%s'\n", loss, (long long)nmicro, nmicro == 1 ? "" : "es",
               r->o.dump_step);
    }
    *sl = (RtStepLog){step + 1, loss, lr, norm, (rt_now() - t0) * 1e3, stage.global * t->seq};
    return RT_OK;
}

/* After a step: its log line, an evaluation when one is due, a checkpoint every N steps, after
 * the last and when a signal asks the run to stop (*stop says whether one did). */
static RtStatus rt_train_after_step(RtTrainRun *r, int64_t step, const RtStepLog *sl, int *stop) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    const RtOptions *o = &r->o;
    RtStatus st = rt_log_step(&r->log, sl, &r->e);
    if (st == RT_OK && r->val && ((step + 1) % t->eval_every == 0 || step + 1 == o->steps)) {
        double vl;
        int64_t used;
        st = rt_evaluate(&r->x, r->val, t->eval_steps * (t->global / t->micro), o->seed, &vl, &used, &r->e);
        if (st == RT_OK) st = rt_log_eval(&r->log, step + 1, vl, used, &r->e);
    }
    *stop = rt_stop_signal != 0;
    if (st == RT_OK && r->ckpt) st = rt_ckpt_report(p, o, r->ckpt, 0, r->waited, &r->log, &r->e);
    if (st != RT_OK || !(*stop || (o->ckpt_every > 0 && ((step + 1) % o->ckpt_every == 0 || step + 1 == o->steps)))) return st;
    if (!r->ckpt) {
        st = rt_ckpt_writer_open(&r->ckpt, p, o->ckpt_dir, o->ckpt_keep, !o->ckpt_sync, r->train, r->ckpt_lock, &r->e);
        r->ckpt_lock = -1; /* the writer's now */
    }
    RtRampStage next = rt_train_stage(t, step + 1);
    RtCkptInfo info = {.step = step + 1,
                       .seed = o->seed,
                       .data = rt_data_tell(r->train),
                       .loss = sl->loss,
                       .lr = sl->lr,
                       .global = next.global,
                       .accum = next.accum,
                       .device = r->x.gpu ? "cuda" : "cpu"};
    if (st == RT_OK) st = rt_exec_pull(&r->x, RT_PULL_PARAMS | RT_PULL_STATE, &r->e);
    if (st == RT_OK) st = rt_ckpt_save(r->ckpt, r->x.pool, r->x.params, r->x.state, &info, &r->waited, &r->e);
    if (st == RT_OK && (*stop || o->ckpt_sync)) st = rt_ckpt_report(p, o, r->ckpt, 1, r->waited, &r->log, &r->e);
    return st;
}

/* After the last step: the last checkpoint's report, the summary, the GPU timing and profile,
 * --save-weights, --save-adapter. */
static RtStatus rt_train_finish(RtTrainRun *r, int64_t first_step, int64_t done_steps, int64_t total_tokens, double t_run,
                                double last_loss) {
    const RtProgram *p = r->p;
    const RtOptions *o = &r->o;
    RtStatus st = r->ckpt ? rt_ckpt_report(p, o, r->ckpt, 1, r->waited, &r->log, &r->e) : RT_OK;
    if (st != RT_OK) return st;
    double secs = rt_now() - t_run;
    st = rt_log_close(&r->log, &r->e);
    r->log_open = 0;
    if (st != RT_OK) return st;
    if (done_steps > 0) {
        printf("done: %lld steps in %.2f s (%.3f ms/step, %.0f tokens/s); final loss %.6f\n", (long long)done_steps, secs,
               secs * 1e3 / (double)done_steps, secs > 0 ? (double)total_tokens / secs : 0.0, last_loss);
    } else if (o->resume) {
        printf("nothing to train: the checkpoint is at step %lld and --steps is %lld\n", (long long)first_step,
               (long long)o->steps);
    }
    if (r->x.gpu) rt_gpu_print_timing(stdout, r->x.gpu); /* MBT_DEBUG / MBT_TRACE: where the GPU's time went */
    if (r->prof) {
        rt_pool_set_profile(r->x.pool, NULL);
        rt_profile_print(stdout, r->prof, rt_pool_threads(r->x.pool));
    }
    if (o->save_weights) {
        st = rt_exec_pull(&r->x, RT_PULL_PARAMS, &r->e);
        if (st == RT_OK) st = rt_weights_save(p, r->x.params, o->save_weights, &r->e);
        if (st != RT_OK) return st;
        printf("saved %lld tensors to '%s'\n", (long long)p->nparams, o->save_weights);
    }
    if (o->save_adapter) {
        int64_t n = 0;
        st = rt_exec_pull(&r->x, RT_PULL_PARAMS, &r->e);
        if (st == RT_OK) st = rt_adapter_save(p, r->x.params, o->save_adapter, &n, &r->e);
        if (st != RT_OK) return st;
        printf("saved the LoRA adapter (%lld tensors) to '%s'\n", (long long)n, o->save_adapter);
    }
    return RT_OK;
}

/* The steps from first_step to --steps, or until a signal asks the run to stop. */
static RtStatus rt_train_loop(RtTrainRun *r, int64_t first_step) {
    const RtOptions *o = &r->o;
    double t_run = rt_now(), last_loss = NAN;
    int64_t total_tokens = 0, done_steps = 0;
    if (r->prof) rt_pool_set_profile(r->x.pool, r->prof);
    rt_stop_signal = 0;
    rt_stop_handlers(1, r->old_handlers);
    r->handlers = 1;
    for (int64_t step = first_step; step < o->steps; step++) {
        if (r->prof) {
            if (step == 1) { /* the first step (first touch of the arena) is a warm-up: not profiled */
                rt_profile_reset(r->prof);
                r->prof->skipped_first = 1;
            }
            rt_profile_begin_step(r->prof);
        }
        RtStepLog sl;
        RtStatus st = rt_train_step(r, step, &sl);
        if (st != RT_OK) return st;
        last_loss = sl.loss;
        total_tokens += sl.tokens;
        done_steps++;
        int stop = 0;
        st = rt_train_after_step(r, step, &sl, &stop);
        if (st != RT_OK) return st;
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_LOG);
        if (stop) {
            rt_log_close(&r->log, &r->e);
            r->log_open = 0;
            int own_dir = strcmp(o->ckpt_dir, r->given->ckpt_dir_default) == 0; /* the program's: no flag needed */
            printf("stopped by %s after step %lld; resume with: %s train --resume latest%s%s\n",
                   rt_stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)(step + 1), o->prog, own_dir ? "" : " --ckpt-dir ",
                   own_dir ? "" : o->ckpt_dir);
            return RT_OK;
        }
    }
    return rt_train_finish(r, first_step, done_steps, total_tokens, t_run, last_loss);
}

static void rt_train_close(RtTrainRun *r) {
    if (r->handlers) rt_stop_handlers(0, r->old_handlers);
    rt_ckpt_writer_close(r->ckpt); /* waits for a write still under way */
    if (r->ckpt_lock >= 0) close(r->ckpt_lock);
    rt_ckpt_info_free(&r->resumed);
    free(r->resume_path);
    if (r->log_open) {
        RtError e2;
        rt_log_close(&r->log, &e2);
    }
    free(r->partial);
    free(r->dump_x);
    free(r->dump_y);
    free(r->dump_p);
    free(r->dump_g);
    rt_exec_close(&r->x);
    free(r->prof);
    rt_data_close(r->val);
    rt_data_close(r->train);
}

int rt_cmd_train(const RtProgram *p, const RtOptions *o) {
    RtTrainRun r = {.p = p, .given = o, .o = *o, .window = p->train.micro * p->train.seq, .ckpt_lock = -1};
    rt_error_clear(&r.e);
    RtStatus st = rt_train_open(&r);
    if (st == RT_OK) {
        rt_train_banner(&r);
        st = rt_train_loop(&r, r.o.resume ? r.resumed.step : 0);
    }
    rt_train_close(&r);
    if (st != RT_OK) rt_report(&r.o, &r.e);
    return st == RT_OK ? 0 : 1;
}

int rt_cmd_eval(const RtProgram *p, const RtOptions *o) {
    const RtTrainSettings *t = &p->train;
    RtError e;
    rt_error_clear(&e);
    RtData *val = NULL;
    RtExec x = {0};
    int code = 1;
    RtDataSpec spec = rt_data_spec(p, o, t->data, o->data ? o->data : t->val_data);
    RtStatus st = RT_OK;
    if (!p->forward_loss) st = rt_fail(&e, RT_ERR_ARG, "this program cannot evaluate: it has no loss-only forward");
    if (st == RT_OK) st = rt_data_open(&val, &spec, RT_SPLIT_VAL, &e);
    if (st == RT_OK) st = rt_exec_open(&x, p, o->threads, rt_device_want(o), &e);
    if (st == RT_OK) st = rt_exec_start_params(&x, o, o->weights, &e);
    if (st == RT_OK) st = rt_exec_push(&x, &e);
    double loss = 0;
    int64_t used = 0;
    if (st == RT_OK) st = rt_evaluate(&x, val, o->steps * (t->global / t->micro), o->seed, &loss, &used, &e);
    if (st == RT_OK) {
        printf("eval %s: loss %.6f (perplexity %.4g) on %lld batches of %lld x %lld tokens from '%s'\n", t->name, loss, exp(loss),
               (long long)used, (long long)t->micro, (long long)t->seq,
               spec.val_pattern && *spec.val_pattern ? spec.val_pattern : spec.pattern);
        code = 0;
    } else {
        rt_report(o, &e);
    }
    rt_exec_close(&x);
    rt_data_close(val);
    return code;
}

/* ---- main --------------------------------------------------------------------------------------- */

int rt_main(int argc, char **argv, const RtProgram *p) {
    RtError e;
    rt_error_clear(&e);
    const char *prog = rt_prog_name(argc > 0 ? argv[0] : NULL);
    if (rt_program_check(p, &e) != RT_OK) {
        fprintf(stderr, "%s: internal error: invalid program descriptor: %s\n", prog, e.msg);
        return 2;
    }
    /* a file-size limit makes a write fail with EFBIG, reported like a full disk, instead of
     * killing the process in the middle of a checkpoint */
    signal(SIGXFSZ, SIG_IGN);
    if (argc >= 2 && strcmp(argv[1], "info") == 0) return rt_cmd_info(p, prog, argc - 2);
    RtOptions o;
    if (rt_cli_parse(&o, p, argc, argv, &e) != RT_OK) {
        fprintf(stderr, "%s: %s\n", prog, e.msg);
        return 1;
    }
    int code = 0;
    switch (o.cmd) {
    case RT_CMD_HELP: rt_cli_help(stdout, p, o.prog); break;
    case RT_CMD_TRAIN: code = rt_cmd_train(p, &o); break;
    case RT_CMD_EVAL: code = rt_cmd_eval(p, &o); break;
    case RT_CMD_GENERATE: code = rt_cmd_generate(p, &o); break;
    }
    rt_options_free(&o);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write to standard output: %s\n", prog, strerror(errno));
        if (code == 0) code = 1;
    }
    return code;
}
