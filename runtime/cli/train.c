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
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
            return rt_fail(err, RT_ERR_ARG, "batch: ramp stage %lld starts at step %lld, not after step %lld",
                           (long long)(i + 1), (long long)r->step, (long long)prev);
        if (r->accum < 1)
            return rt_fail(err, RT_ERR_ARG, "batch: ramp stage %lld (step %lld) has accumulation %lld", (long long)(i + 1),
                           (long long)r->step, (long long)r->accum);
        if (r->global / t->micro / t->data_ranks != r->accum || r->global != t->micro * r->accum * t->data_ranks)
            return rt_fail(err, RT_ERR_ARG,
                           "batch: ramp stage %lld (step %lld): global %lld is not micro %lld x accumulation %lld x data %lld",
                           (long long)(i + 1), (long long)r->step, (long long)r->global, (long long)t->micro,
                           (long long)r->accum, (long long)t->data_ranks);
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
    if (p->nparams < 0 || (p->nparams > 0 && !p->params) || p->param_floats < 0 || p->state_floats < 0 ||
        p->arena_bytes < 0 || (p->forward_logits && p->logits_seq < 1))
        return rt_fail(err, RT_ERR_ARG, "a region size or the parameter count is negative");
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

/* ---- the device -------------------------------------------------------------------------------- */

RtDeviceWant rt_device_want(const RtOptions *o) {
    return strcmp(o->device, "cuda") == 0 ? RT_DEVICE_CUDA : strcmp(o->device, "cpu") == 0 ? RT_DEVICE_CPU : RT_DEVICE_AUTO;
}

/* The `device:` line: the GPU, or the CPU's threads (and, under auto, why not a GPU). */
void rt_print_device(const RtOptions *o, const RtExec *x) {
    if (x->gpu) printf("device: cuda, %s\n", rt_exec_device(x));
    else
        printf("device: cpu%s, %d threads%s%s\n", strcmp(o->device, "auto") == 0 ? " (auto)" : "", rt_pool_threads(x->pool),
               x->cpu_reason ? "; no GPU: " : "", x->cpu_reason ? x->cpu_reason : "");
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
        rt_init_param_range(j->params + q->offset + b, b, e, j->seed, rt_hash_name(q->name), q->init, q->init_a, q->init_b,
                            NULL);
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
static RtStatus rt_evaluate(RtExec *e, RtData *val, int64_t batches, uint64_t seed, double *loss, int64_t *used,
                            RtError *err) {
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

/* A file the run will write at its end must have a writable directory now: a typo in
 * --save-weights should cost a second, not the whole run. */
static RtStatus rt_check_output_dir(const char *path, const char *what, RtError *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK | X_OK) != 0)
        return rt_fail_errno(err, errno, "cannot write the %s '%s': directory '%s'", what, path, dir);
    return RT_OK;
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
            return rt_fail(err, d.status, "checkpoint at step %lld failed: %s; earlier checkpoints are untouched; stopping "
                                          "(checkpoint { on_error = \"continue\" } trains on)",
                           (long long)d.step, d.err.msg);
        rt_log_checkpoint(log, &d, waited_s, err);
        fflush(stdout);
        fprintf(stderr, "%s: warning: checkpoint at step %lld failed: %s; earlier checkpoints are untouched; training goes on\n",
                o->prog, (long long)d.step, d.err.msg);
    }
    return RT_OK;
}

int rt_cmd_train(const RtProgram *p, const RtOptions *o0) {
    const RtTrainSettings *t = &p->train;
    RtOptions run = *o0; /* a resumed run takes the checkpoint's seed */
    const RtOptions *o = &run;
    RtError e;
    rt_error_clear(&e);
    RtData *train = NULL, *val = NULL;
    RtExec x = {0};
    RtLog log;
    int log_open = 0, code = 1;
    double *partial = NULL;
    RtProfile *prof = NULL; /* MBT_PROFILE=1: where the step time goes (rt_profile.h) */
    RtCkptWriter *ckpt = NULL;
    RtCkptInfo resumed = {0};
    char *resume_path = NULL;
    const char *resume_arg = o->resume ? o->resume : o->resume_weights_only;
    struct sigaction old_handlers[2];
    int handlers = 0;
    RtStatus st = o->save_weights ? rt_check_output_dir(o->save_weights, "weights file", &e) : RT_OK;
    if (st == RT_OK) st = rt_exec_open(&x, p, o->threads, rt_device_want(o), &e);
    if (st == RT_OK && resume_arg) {
        st = rt_ckpt_resolve(resume_arg, o->ckpt_dir, &resume_path, &e);
        if (st == RT_OK) st = rt_ckpt_load(p, resume_path, !o->resume, x.params, x.state, &resumed, &e);
        if (st == RT_OK && o->resume) {
            if (o->seed_given && o->seed != resumed.seed)
                st = rt_fail(&e, RT_ERR_ARG, "--seed %llu, but checkpoint '%s' was trained with seed %llu (leave --seed out to resume)",
                             (unsigned long long)o->seed, resume_path, (unsigned long long)resumed.seed);
            run.seed = resumed.seed;
        }
    }
    RtDataSpec spec = rt_data_spec(p, o, o->data ? o->data : t->data, t->val_data);
    if (st == RT_OK) st = rt_data_open(&train, &spec, RT_SPLIT_TRAIN, &e);
    if (st == RT_OK && t->eval_every > 0) st = rt_data_open(&val, &spec, RT_SPLIT_VAL, &e);
    if (st == RT_OK && o->resume) st = rt_ckpt_check_data(&resumed, resume_path, train, &e);
    if (st == RT_OK && o->resume) {
        st = rt_data_seek(train, &resumed.data, &e);
        if (st != RT_OK) rt_error_context(&e, "checkpoint '%s': the training data are not those it was trained on", resume_path);
    }
    if (st == RT_OK && rt_profile_requested()) {
        prof = calloc(1, sizeof *prof);
        if (!prof) st = rt_fail_errno(&e, ENOMEM, "cannot allocate the profile");
    }
    if (st == RT_OK && !resume_arg) st = rt_exec_start_params(&x, o, o->init_weights, &e);
    if (st == RT_OK && p->optimizer_init && !o->resume) { /* on the host; pushed below */
        RtStep s = {.pool = x.pool, .params = x.params, .grads = x.grads, .state = x.state, .seed = o->seed, .err = &e};
        st = p->optimizer_init(&s);
        if (st != RT_OK) rt_error_context(&e, "initialising the optimizer state");
    }
    if (st == RT_OK) st = rt_exec_push(&x, &e);
    int64_t nblocks = rt_exec_grad_blocks(p);
    if (st == RT_OK) {
        partial = calloc(nblocks > 0 ? (size_t)nblocks : 1, sizeof *partial);
        if (!partial) st = rt_fail_errno(&e, ENOMEM, "cannot allocate the gradient-norm blocks");
    }
    /* --dump-step keeps step 1's batches (micro-batch after micro-batch), and its parameters and
     * gradients as they were before clipping and the update */
    int32_t *dump_x = NULL, *dump_y = NULL;
    float *dump_p = NULL, *dump_g = NULL;
    int64_t window = t->micro * t->seq;
    if (st == RT_OK && o->dump_step) {
        st = rt_check_output_dir(o->dump_step, "step dump", &e);
        dump_x = calloc((size_t)(t->accum * t->data_ranks * window), sizeof *dump_x); /* step 1's micro-batches */
        dump_y = calloc((size_t)(t->accum * t->data_ranks * window), sizeof *dump_y);
        dump_p = calloc((size_t)p->param_floats + 1, sizeof *dump_p);
        dump_g = calloc((size_t)p->param_floats + 1, sizeof *dump_g);
        if (st == RT_OK && (!dump_x || !dump_y || !dump_p || !dump_g))
            st = rt_fail_errno(&e, ENOMEM, "cannot hold the step to dump");
        if (st == RT_OK && o->steps < 1) st = rt_fail(&e, RT_ERR_ARG, "--dump-step needs at least one step (--steps 0)");
    }
    if (st == RT_OK && o->ckpt_every > 0) st = rt_ckpt_writer_open(&ckpt, p, o->ckpt_dir, o->ckpt_keep, !o->ckpt_sync, train, &e);
    if (st == RT_OK) st = rt_log_open(&log, stdout, isatty(fileno(stdout)), o->log_path, o->resume != NULL, o->steps, &e);
    if (st != RT_OK) goto done;
    log_open = 1;

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
    rt_print_device(o, &x);
    printf("data: %lld windows in %lld file%s ('%s')\n", (long long)rt_data_windows(train),
           (long long)rt_data_nfiles(train), rt_data_nfiles(train) == 1 ? "" : "s", spec.pattern);
    if (resume_path && o->resume)
        printf("resumed from '%s': step %lld done (loss %.6f); training goes on to step %lld\n", resume_path,
               (long long)resumed.step, resumed.loss, (long long)o->steps);
    else if (resume_path)
        printf("weights from checkpoint '%s'; the optimizer, the step and the data start afresh\n", resume_path);
    if (ckpt)
        printf("checkpoints: every %lld steps to '%s'%s, %s\n", (long long)o->ckpt_every, o->ckpt_dir,
               o->ckpt_keep ? "" : ", all kept", o->ckpt_sync ? "written before training goes on" : "written in the background");
    fflush(stdout);

    double t_run = rt_now(), last_loss = NAN, waited = 0;
    int64_t total_tokens = 0, first_step = o->resume ? resumed.step : 0, done_steps = 0;
    if (prof) rt_pool_set_profile(x.pool, prof);
    rt_stop_signal = 0;
    rt_stop_handlers(1, old_handlers);
    handlers = 1;
    for (int64_t step = first_step; step < o->steps; step++) {
        if (prof) {
            if (step == 1) { /* the first step (first touch of the arena) is a warm-up: not profiled */
                rt_profile_reset(prof);
                prof->skipped_first = 1;
            }
            rt_profile_begin_step(prof);
        }
        double t0 = rt_now();
        /* this step's batch: its ramp stage; all data ranks' micro-batches run here, in turn */
        RtRampStage stage = rt_train_stage(t, step);
        int64_t nmicro = stage.accum * t->data_ranks, tokens = stage.global * t->seq;
        double mult = p->lr_schedule(step);
        double lr = t->lr * mult;
        if (!isfinite(lr)) {
            st = rt_fail(&e, RT_ERR_ARG, "step %lld: the learning-rate schedule gave %g", (long long)(step + 1), mult);
            goto done;
        }
        double loss = 0;
        /* the step's first micro-batch; each next one is read while the GPU runs the one before
         * (exec.c: the GPU has two pairs of batch buffers) */
        RtError enext;
        RtStatus next = rt_data_next(train, t->micro, x.x, x.y, &enext);
        for (int64_t m = 0; m < nmicro; m++) {
            st = next;
            if (st != RT_OK) e = enext;
            if (st == RT_OK) st = rt_exec_batch(&x, window, &e);
            if (st != RT_OK) {
                rt_error_context(&e, "step %lld", (long long)(step + 1));
                goto done;
            }
            if (dump_x && step == 0) {
                memcpy(dump_x + m * window, x.x, (size_t)window * sizeof *dump_x);
                memcpy(dump_y + m * window, x.y, (size_t)window * sizeof *dump_y);
            }
            if (prof) rt_profile_phase(prof, RT_PROF_DATA);
            RtStep s = rt_exec_step(&x, &e);
            s.B = t->micro, s.T = t->seq, s.loss_scale = 1.0 / (double)nmicro, s.step = step, s.micro = m, s.seed = o->seed;
            st = rt_exec_queue(&x, RT_EXEC_FORWARD_BACKWARD, &s);
            if (st == RT_OK && m + 1 < nmicro) {
                rt_exec_flip(&x);
                next = rt_data_next(train, t->micro, x.x, x.y, &enext);
            }
            if (st == RT_OK) st = rt_exec_wait(&x, &e); /* s.loss is set */
            if (st != RT_OK) {
                rt_error_context(&e, "step %lld, micro-batch %lld", (long long)(step + 1), (long long)(m + 1));
                goto done;
            }
            if (prof) rt_profile_phase(prof, RT_PROF_FB);
            if (!isfinite(s.loss)) {
                st = rt_fail(&e, RT_ERR_ARG, "step %lld, micro-batch %lld: the loss is %s; stopping", (long long)(step + 1),
                             (long long)(m + 1), isnan(s.loss) ? "nan" : s.loss > 0 ? "inf" : "-inf");
                goto done;
            }
            loss += s.loss * s.loss_scale;
        }
        if (dump_x && step == 0) {
            st = rt_exec_pull(&x, RT_PULL_PARAMS | RT_PULL_GRADS, &e);
            if (st != RT_OK) goto done;
            memcpy(dump_p, x.params, (size_t)p->param_floats * sizeof *dump_p);
            memcpy(dump_g, x.grads, (size_t)p->param_floats * sizeof *dump_g);
        }
        double norm = 0;
        st = rt_exec_grad_norm(&x, partial, &norm, &e);
        if (st == RT_OK && t->clip > 0 && t->clip / (norm + RT_CLIP_EPS) < 1)
            st = rt_exec_grad_scale(&x, (float)(t->clip / (norm + RT_CLIP_EPS)), &e);
        if (st != RT_OK) {
            rt_error_context(&e, "step %lld: the gradient norm", (long long)(step + 1));
            goto done;
        }
        if (prof) rt_profile_phase(prof, RT_PROF_NORM);
        RtStep s = rt_exec_step(&x, &e);
        s.lr = lr, s.t = step + 1, s.step = step, s.seed = o->seed;
        st = rt_exec_call(&x, RT_EXEC_UPDATE, &s);
        if (st == RT_OK) st = rt_exec_grad_zero(&x, &e);
        if (st != RT_OK) {
            rt_error_context(&e, "step %lld: optimizer", (long long)(step + 1));
            goto done;
        }
        if (prof) rt_profile_phase(prof, RT_PROF_UPDATE);
        if (prof) rt_profile_phase(prof, RT_PROF_ZERO);
        if (dump_x && step == 0) {
            st = rt_exec_pull(&x, RT_PULL_PARAMS, &e);
            if (st != RT_OK) goto done;
            RtStepDump d = {dump_p, dump_g, x.params, dump_x, dump_y, nmicro, loss, lr, t->clip};
            st = rt_step_dump(p, &d, o->dump_step, &e);
            if (st != RT_OK) goto done;
            printf("wrote step 1 (loss %.9g, %lld micro-batch%s) to '%s'\n", loss, (long long)nmicro,
                   nmicro == 1 ? "" : "es", o->dump_step);
        }
        last_loss = loss;
        total_tokens += tokens;
        RtStepLog sl = {step + 1, loss, lr, norm, (rt_now() - t0) * 1e3, tokens};
        st = rt_log_step(&log, &sl, &e);
        if (st != RT_OK) goto done;
        if (val && ((step + 1) % t->eval_every == 0 || step + 1 == o->steps)) {
            double vl;
            int64_t used;
            st = rt_evaluate(&x, val, t->eval_steps * (t->global / t->micro), o->seed, &vl, &used, &e);
            if (st == RT_OK) st = rt_log_eval(&log, step + 1, vl, used, &e);
            if (st != RT_OK) goto done;
        }
        done_steps++;
        /* checkpoints: every N steps, after the last, and when a signal asks the run to stop */
        int stop = rt_stop_signal != 0;
        if (ckpt) st = rt_ckpt_report(p, o, ckpt, 0, waited, &log, &e);
        if (st != RT_OK) goto done;
        if (stop || (o->ckpt_every > 0 && ((step + 1) % o->ckpt_every == 0 || step + 1 == o->steps))) {
            if (!ckpt) st = rt_ckpt_writer_open(&ckpt, p, o->ckpt_dir, o->ckpt_keep, !o->ckpt_sync, train, &e);
            RtCkptInfo info = {.step = step + 1, .seed = o->seed, .data = rt_data_tell(train), .loss = loss, .lr = lr,
                           .device = x.gpu ? "cuda" : "cpu"};
            if (st == RT_OK) st = rt_exec_pull(&x, RT_PULL_PARAMS | RT_PULL_STATE, &e);
            if (st == RT_OK) st = rt_ckpt_save(ckpt, x.pool, x.params, x.state, &info, &waited, &e);
            if (st == RT_OK && (stop || o->ckpt_sync)) st = rt_ckpt_report(p, o, ckpt, 1, waited, &log, &e);
            if (st != RT_OK) goto done;
        }
        if (prof) rt_profile_phase(prof, RT_PROF_LOG);
        if (stop) {
            rt_log_close(&log, &e);
            log_open = 0;
            int own_dir = strcmp(o->ckpt_dir, o0->ckpt_dir_default) == 0; /* the program's: no flag needed */
            printf("stopped by %s after step %lld; resume with: %s train --resume latest%s%s\n",
                   rt_stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)(step + 1), o->prog,
                   own_dir ? "" : " --ckpt-dir ", own_dir ? "" : o->ckpt_dir);
            code = 0;
            goto done;
        }
    }
    if (ckpt) st = rt_ckpt_report(p, o, ckpt, 1, waited, &log, &e);
    if (st != RT_OK) goto done;
    double secs = rt_now() - t_run;
    st = rt_log_close(&log, &e);
    log_open = 0;
    if (st != RT_OK) goto done;
    if (done_steps > 0) {
        printf("done: %lld steps in %.2f s (%.3f ms/step, %.0f tokens/s); final loss %.6f\n", (long long)done_steps, secs,
               secs * 1e3 / (double)done_steps, secs > 0 ? (double)total_tokens / secs : 0.0, last_loss);
    } else if (o->resume) {
        printf("nothing to train: the checkpoint is at step %lld and --steps is %lld\n", (long long)first_step, (long long)o->steps);
    }
    if (x.gpu) rt_gpu_print_timing(stdout, x.gpu); /* MBT_DEBUG / MBT_TRACE: where the GPU's time went */
    if (prof) {
        rt_pool_set_profile(x.pool, NULL);
        rt_profile_print(stdout, prof, rt_pool_threads(x.pool));
    }
    if (o->save_weights) {
        st = rt_exec_pull(&x, RT_PULL_PARAMS, &e);
        if (st == RT_OK) st = rt_weights_save(p, x.params, o->save_weights, &e);
        if (st != RT_OK) goto done;
        printf("saved %lld tensors to '%s'\n", (long long)p->nparams, o->save_weights);
    }
    code = 0;
done:
    if (handlers) rt_stop_handlers(0, old_handlers);
    rt_ckpt_writer_close(ckpt); /* waits for a write still under way */
    rt_ckpt_info_free(&resumed);
    free(resume_path);
    if (log_open) {
        RtError e2;
        rt_log_close(&log, &e2);
    }
    if (code != 0) rt_report(o, &e);
    free(partial);
    free(dump_x);
    free(dump_y);
    free(dump_p);
    free(dump_g);
    rt_exec_close(&x);
    free(prof);
    rt_data_close(val);
    rt_data_close(train);
    return code;
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
        printf("eval %s: loss %.6f (perplexity %.4g) on %lld batches of %lld x %lld tokens from '%s'\n", t->name, loss,
               exp(loss), (long long)used, (long long)t->micro, (long long)t->seq,
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
