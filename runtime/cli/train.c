/* train.c - the train and eval commands: the memory of a run, the train loop and evaluation (see
 * rt_exec.h; docs/runtime.md, "The train loop").
 *
 * Pipeline position: under rt_main (program.c), which checks the program's descriptor, parses the
 * command line (cli.c) and runs a command. Training, per optimizer step:
 *
 *     lr = base lr x lr_schedule(step); (global, accum) = the step's batch-ramp stage
 *     for each of this process's micro-batches (accum a rank; alone, accum x data_ranks): read B
 *         windows, forward_backward (adds grad(loss) / (accum x data_ranks) into a zeroed region),
 *         and the regions summed by one binary tree over the micro-batch indices (rt_exec_tree_*)
 *     with several ranks: the partial sums exchanged by shard, summed by the tree over the ranks,
 *         gathered (rt_train_reduce); the loss: every micro-batch's, by the tree over all of them
 *     norm = the global L2 norm of the gradient region; if clip > 0 and norm > clip, scale it
 *     optimizer_update(lr, t = step + 1) (ZeRO: on this rank's shard, then the shards gathered);
 *     zero the gradients; log
 *
 * Determinism: initialisation is a function of (seed, name, element); the data order of (seed,
 * epoch); every parallel loop gives each element to one thread; the gradient norm sums fixed
 * blocks in block order; the step's gradient and loss are sums in one tree over the micro-batch
 * indices (docs/parallel.md: the same bits at 1, 2 or 4 ranks where accum is a power of two). So a run is a function of its program, flags and data, never of the
 * thread count (tests/unit/test_rt_train.c compares weights files byte for byte).
 *
 * One step (the loop above, from the micro-batches to the update) is train_step.c's, the ranks'
 * side of a step (the world, the reduction, ZeRO's shards) train_dp.c's, and the check of the
 * run's outputs before it starts train_outputs.c's; train_internal.h holds the run's state they
 * share. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_store.h"
#include "train_internal.h"

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

/* A pure function of the step, so a resumed run (which restores the step) is where the curriculum
 * was; the same rule as the compiler's train_seq_at (settings.h). */
int64_t rt_train_seq_len(const RtTrainSettings *t, int64_t step) {
    const int64_t *st = NULL;
    for (int64_t i = 0; i < t->ncurriculum && t->curriculum[3 * i] <= step; i++) st = t->curriculum + 3 * i;
    return st ? t->curriculum_lens[st[1] + (step - st[0]) % st[2]] : t->seq;
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
 * micro-batches). With a world of several ranks (comm, else NULL) rank r evaluates batches
 * [batches x r / N, batches x (r + 1) / N) alone, and the losses are gathered (rank order is batch
 * order) and added one after another in batch order, as one process adds them: the same number
 * at any number of ranks (docs/parallel.md). */
static RtStatus rt_evaluate(RtExec *e, RtData *val, int64_t batches, uint64_t seed, RtComm *comm, double *loss, int64_t *used,
                            RtError *err) {
    const RtProgram *p = e->prog;
    if (!p->forward_loss) return rt_fail(err, RT_ERR_ARG, "this program cannot evaluate: it has no loss-only forward");
    int64_t B = p->train.micro, T = p->train.seq;
    int64_t have = rt_data_windows(val) / B;
    if (have < 1)
        return rt_fail(err, RT_ERR_ARG, "the held-out data have %lld windows of %lld tokens, fewer than one batch of %lld",
                       (long long)rt_data_windows(val), (long long)(T + 1), (long long)B);
    if (batches > have) batches = have;
    int n = comm ? rt_comm_size(comm) : 1, r = comm ? rt_comm_rank(comm) : 0;
    int64_t lo = batches * r / n, hi = batches * (r + 1) / n, most = (batches + n - 1) / n;
    /* this rank's losses (most slots, the unused ones NaN), then every rank's */
    double *mine = malloc((size_t)(most + 1) * sizeof *mine), *all = malloc((size_t)(most * n + 1) * sizeof *all);
    if (!mine || !all) {
        free(mine), free(all);
        return rt_fail_errno(err, ENOMEM, "cannot allocate the evaluation's losses");
    }
    rt_data_rewind(val);
    rt_data_skip(val, lo * B);
    RtStatus st = RT_OK;
    for (int64_t b = lo; st == RT_OK && b < hi; b++) {
        st = rt_data_next(val, B, e->x, e->y, err);
        if (st == RT_OK) st = rt_exec_batch(e, B * T, err);
        if (st != RT_OK) break;
        RtStep s = rt_exec_step(e, err);
        s.B = B, s.T = T, s.seed = seed; /* s.training 0: forward_loss's key */
        if (p->stat_floats > 0) {        /* global_mean: each held-out micro-batch is its own global batch */
            st = rt_exec_call(e, RT_EXEC_FORWARD_STATS, &s);
            if (st == RT_OK) memcpy(e->stats, e->stats_out, (size_t)p->stat_floats * sizeof *e->stats);
            if (st == RT_OK) st = rt_exec_stats(e, err);
            if (st != RT_OK) return rt_error_context(err, "evaluation, batch %lld", (long long)(b + 1));
        }
        st = rt_exec_call(e, RT_EXEC_FORWARD_LOSS, &s);
        if (st != RT_OK) rt_error_context(err, "evaluation, batch %lld", (long long)(b + 1));
        mine[b - lo] = s.loss;
    }
    for (int64_t k = hi - lo; k < most; k++) mine[k] = NAN;
    if (st == RT_OK && n > 1) {
        st = rt_comm_gather_f64(comm, mine, most, all, err);
        if (st != RT_OK) rt_error_context(err, "evaluation: gathering the ranks' losses");
    } else if (st == RT_OK) {
        memcpy(all, mine, (size_t)most * sizeof *all);
    }
    double sum = 0;
    for (int k = 0; st == RT_OK && k < n; k++) /* batch order: rank k's [batches x k / n, batches x (k + 1) / n) */
        for (int64_t b = batches * k / n; b < batches * (k + 1) / n; b++) sum += all[k * most + b - batches * k / n];
    free(mine), free(all);
    if (st != RT_OK) return st;
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
volatile sig_atomic_t rt_stop_signal; /* train_internal.h */

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

/* ---- opening the run --------------------------------------------------------------------------- */

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

/* offload { optimizer = nvme }: the state (initialised, resumed, or zero) moved into a store file
 * in --offload-dir, and its memory freed. One file a process, named for the program's train block,
 * the process and the rank, so that runs and ranks sharing a directory never share a file. */
static RtStatus rt_train_offload_open(RtTrainRun *r) {
    const RtProgram *p = r->p;
    char name[256];
    snprintf(name, sizeof name, "mbt-%s-%ld-rank%d.optimizer", p->train.name, (long)getpid(), r->rank);
    for (char *c = name; *c; c++)
        if (*c == '/') *c = '_';
    /* the state is all zeros unless it was resumed or an optimizer_init ran: the new file reads as zeros */
    const float *from = r->x.state && (r->o.resume || p->optimizer_init) ? r->x.state : NULL;
    RtStatus st = rt_opt_offload_open(&r->offload, p, r->o.offload_dir, name, from, &r->e);
    if (st != RT_OK) return st;
    free(r->x.state);
    r->x.state = NULL;
    return RT_OK;
}

/* Everything before the first step: the device, a resumed checkpoint, the data, the parameters
 * and the optimizer state on the device, the checkpoint writer and the log. */
static RtStatus rt_train_open(RtTrainRun *r) {
    const RtProgram *p = r->p;
    const RtOptions *o = &r->o;
    const char *resume_arg = o->resume ? o->resume : o->resume_weights_only;
    RtStatus st = rt_exec_open(&r->x, p, o->threads, rt_device_want(o), &r->e);
    /* offload { optimizer = nvme }: no state region (exec.c), but for a state to read from a
     * checkpoint or to initialise, which then fills the store (rt_train_offload_open) */
    if (st == RT_OK && p->train.offload_optimizer == 2 && (resume_arg || p->optimizer_init)) {
        size_t bytes = ((size_t)p->state_floats * 4 + RT_ALIGN - 1) / RT_ALIGN * RT_ALIGN + RT_ALIGN;
        int rc = posix_memalign((void **)&r->x.state, RT_ALIGN, bytes);
        if (rc) r->x.state = NULL, st = rt_fail_errno(&r->e, rc, "cannot allocate the optimizer state to fill its store");
        else memset(r->x.state, 0, bytes);
    }
    if (st == RT_OK && resume_arg) st = rt_train_resume(r, resume_arg);
    if (st == RT_OK) st = rt_train_data(r);
    if (st == RT_OK) st = rt_train_check_outputs(r);
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
    if (st == RT_OK && p->train.offload_optimizer == 2) st = rt_train_offload_open(r);
    /* offload { activations }: nvme's store, like the optimizer's; host's pinned memory */
    if (st == RT_OK && p->train.offload_act_bytes > 0) {
        char name[256];
        snprintf(name, sizeof name, "mbt-%s-%ld-rank%d.activations", p->train.name, (long)getpid(), r->rank);
        for (char *c = name; *c; c++)
            if (*c == '/') *c = '_';
        if (o->offload_staging && !r->x.gpu)
            st = rt_fail(&r->e, RT_ERR_ARG,
                         "--offload-staging: this run is on the CPU, whose activations go to the store without staging (it "
                         "is for a GPU run)");
        r->x.act_staging = o->offload_staging;
        if (st == RT_OK) st = rt_exec_act_open(&r->x, o->offload_dir, name, &r->e);
    }
    if (st == RT_OK && p->train.offload_act && r->x.gpu) {
        /* the rate the copies run at here, against the plan's assumption (mbtc --offload-gbps):
         * over the arena's first bytes, before anything is in it */
        int64_t n = p->train.offload_act_bytes < p->arena_bytes ? p->train.offload_act_bytes : p->arena_bytes;
        if (n > rt_gpu_act_bytes(r->x.gpu)) n = rt_gpu_act_bytes(r->x.gpu); /* nvme: the staging */
        if (n > ((int64_t)64 << 20)) n = (int64_t)64 << 20;
        r->act_rate_bytes = n;
        st = rt_gpu_act_rate(r->x.gpu, r->x.d_arena, n, &r->act_gbps_out, &r->act_gbps_back, &r->e);
    }
    int64_t nblocks = rt_exec_grad_blocks(p);
    if (st == RT_OK) {
        r->partial = calloc(nblocks > 0 ? (size_t)nblocks : 1, sizeof *r->partial);
        if (!r->partial) st = rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient-norm blocks");
    }
    if (st == RT_OK && o->dump_step) st = rt_train_dump_alloc(r);
    if (st == RT_OK) st = rt_train_tree_alloc(r);     /* ZeRO shards the state here ... */
    if (st == RT_OK) st = rt_exec_push(&r->x, &r->e); /* ... before the GPU's is allocated */
    if (st == RT_OK && o->ckpt_every > 0 && r->rank == 0) {
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
    int64_t values = 0; /* the program's: not the region's alignment, nor a padded vocabulary's rows (docs/cuda.md) */
    for (int64_t i = 0; i < p->nparams; i++) values += p->params[i].numel;
    rt_fmt_int(nparam, sizeof nparam, values);
    char data_ranks[48] = "", world[160] = "";
    if (t->data_ranks > 1) snprintf(data_ranks, sizeof data_ranks, " x %lld data ranks", (long long)t->data_ranks);
    int nranks = rt_comm_size(r->comm);
    if (nranks > 1)
        snprintf(world, sizeof world, "; %d processes (%s, started by %s)", nranks, rt_comm_backend(r->comm),
                 rt_comm_launcher(r->comm));
    printf("train %s: %s parameters in %lld tensors; %lld steps of %lld sequences x %lld tokens (micro-batch %lld, "
           "accumulation %lld%s%s); seed %llu%s\n",
           t->name, nparam, (long long)p->nparams, (long long)o->steps, (long long)t->global, (long long)t->seq,
           (long long)t->micro, (long long)t->accum, data_ranks, t->nramp > 0 ? ", then ramped" : "", (unsigned long long)o->seed,
           world);
    for (int64_t i = 0; i < t->nramp; i++)
        printf("batch ramp: from step %lld, %lld sequences a step (accumulation %lld)%s\n", (long long)(t->ramp[i].step + 1),
               (long long)t->ramp[i].global, (long long)t->ramp[i].accum,
               t->ramp[i].step >= o->steps ? "; not reached in this run" : "");
    for (int64_t i = 0; i < t->ncurriculum; i++) {
        const int64_t *c = t->curriculum + 3 * i;
        printf("sequence lengths: from step %lld, a micro-batch is", (long long)(c[0] + 1));
        for (int64_t j = 0; j < c[2]; j++) {
            int64_t len = t->curriculum_lens[c[1] + j];
            printf("%s %lld x %lld tokens", j ? (j + 1 == c[2] ? " and" : ",") : "", (long long)(t->micro * t->seq / len),
                   (long long)len);
        }
        printf("%s%s\n", c[2] > 1 ? " in turn, one a step" : "", c[0] >= o->steps ? "; not reached in this run" : "");
    }
    if (nranks > 1)
        printf("data-parallel: %d processes, each %lld micro-batches of %lld a step (its share of the global batch); "
               "the gradient summed by one tree over the %lld micro-batches\n",
               nranks, (long long)t->accum, (long long)t->micro, (long long)(t->accum * t->data_ranks));
    else if (t->data_ranks > 1)
        printf("data-parallel: the program's %lld data ranks run in this one process, one after another: "
               "%lld micro-batches of %lld a step, the whole global batch\n",
               (long long)t->data_ranks, (long long)(t->accum * t->data_ranks), (long long)t->micro);
    if (r->buckets)
        printf("data-parallel: the ranks' sum in %d buckets of at most %lld floats (MBT_DP_BUCKET_MB), the last parameters "
               "first, by a communication thread: %s\n",
               rt_dp_reduce_buckets(r->buckets), (long long)rt_dp_reduce_bucket_floats(r->buckets),
               r->overlap ? "each starts during the last micro-batch's backward once its gradients are final"
               : r->x.gpu ? "after the backward (the GPU's), bucket b + 1's exchange overlapping bucket b's sum"
                          : "after the backward (MBT_DP_OVERLAP=0), bucket b + 1's exchange overlapping bucket b's sum");
    if (r->zbuckets)
        printf("data-parallel: ZeRO-2's exchange in %d buckets of at most %lld floats (MBT_DP_BUCKET_MB), the last parameters "
               "first, by a communication thread during every micro-batch's backward: each bucket, once its gradients are "
               "final, cut at the ZeRO shards, its piece of shard k sent to rank k and this rank's summed over the ranks into "
               "its shard of the block sum, joined before the next micro-batch; receive buffer %lld bytes (the whole "
               "exchange's: %lld)\n",
               rt_dp_reduce_buckets(r->zbuckets), (long long)r->bucket_floats, (long long)rt_dp_reduce_recv_bytes(r->zbuckets),
               (long long)((r->shard_off[r->rank + 1] - r->shard_off[r->rank]) * nranks * 4));
    else if (r->gzbuckets)
        printf("data-parallel: ZeRO-2's exchange on the GPUs in %d buckets of at most %lld floats (MBT_DP_BUCKET_MB), the "
               "last parameters first, on a communication stream during every micro-batch's backward: each bucket, once "
               "its gradients are final (after an event of the compute stream), cut at the ZeRO shards, its piece of shard "
               "k sent to rank k by NCCL and this rank's summed over the ranks into its shard of the block sum, joined "
               "before the next micro-batch; receive buffer %lld bytes on the GPU (the whole exchange's: %lld); every "
               "micro-batch runs uncaptured (no CUDA graph)\n",
               r->gbuckets_n, (long long)r->bucket_floats, (long long)r->gz_recv_bytes,
               (long long)((r->shard_off[r->rank + 1] - r->shard_off[r->rank]) * nranks * 4));
    else if (r->shard_tree_on && nranks > 1 && (!r->x.gpu || r->zero == 2))
        printf("data-parallel: ZeRO-2's exchange whole after each micro-batch's backward (%s)\n",
               r->zero == 3                          ? "ZeRO-3: its gathers use the communicator during the backward"
               : p->param_floats <= r->bucket_floats ? "one bucket: MBT_DP_BUCKET_MB"
               : r->x.gpu && !r->nccl_grads          ? "the GPU without NCCL: each gradient comes down whole"
                                                     : "MBT_DP_OVERLAP=0");
    if (r->gbuckets && !r->gzbuckets)
        printf("data-parallel: the ranks' sum on the GPUs in %d buckets of at most %lld floats (MBT_DP_BUCKET_MB), the last "
               "parameters first, on a communication stream: each queued during the last micro-batch's backward once its "
               "gradients are final (after an event of the compute stream), its shards exchanged and gathered by NCCL, GPU "
               "to GPU, and summed on its rank's GPU by the same tree; that micro-batch runs uncaptured (no CUDA graph)\n",
               r->gbuckets_n, (long long)r->bucket_floats);
    else if (r->nccl_grads && !r->gzbuckets)
        printf("data-parallel: the ranks' sum on the GPUs, after the backward: shards exchanged and gathered by NCCL, GPU to "
               "GPU, each summed on its rank's GPU by the same tree\n");
    if (r->zero3)
        printf("ZeRO-3: this rank holds elements [%lld, %lld) of the parameters, of the optimizer state and of the summed "
               "gradient, and gathers the rest of each parameter range around its uses in the forward and the backward "
               "(%lld floats at most at once besides its shard), the next gather prefetched%s\n",
               (long long)r->shard_off[r->rank], (long long)r->shard_off[r->rank + 1], (long long)p->plan.gather_window,
               !rt_zero3_on_gpu(r->zero3) ? ""
               : r->nccl_grads
                   ? "; on the GPU: pages of a reserved region mapped around the uses, gathered by NCCL on a stream of their "
                     "own that the launches wait for; the steps run uncaptured (no CUDA graph)"
                   : "; on the GPU: pages of a reserved region mapped around the uses, gathered through the host and uploaded "
                     "on a stream of their own that the launches wait for; the steps run uncaptured (no CUDA graph)");
    else if (r->zero)
        printf("ZeRO-%d: this rank holds and updates elements [%lld, %lld) of the optimizer state%s; the updated "
               "parameters are gathered\n",
               r->zero, (long long)r->shard_off[r->rank], (long long)r->shard_off[r->rank + 1],
               r->zero == 2 ? " and keeps that shard alone of the summed gradient" : "");
    else if (t->zero) printf("ZeRO-%lld: one process holds every shard\n", (long long)t->zero);
    if (nranks > 1) { /* the gradient's partial sums besides the gradient region: which path, and their bytes */
        int64_t whole = (int64_t)(r->x.ntree - 1) * p->param_floats * 4;
        if (r->x.ntree <= 1 && (!r->shard_tree_on || r->shard_tree.nreg == 0))
            printf("gradient partial sums: none (one micro-batch a rank a step: its gradient is summed over the ranks "
                   "as it is)\n");
        else if (r->shard_tree_on)
            printf("gradient partial sums: by shard (ZeRO-%d, %d ranks, a power of two): a step of 2 or more micro-batches a "
                   "rank runs global micro-batches j x %d + %d, each one's gradient exchanged by shards as it comes and this "
                   "rank's shard summed over the ranks, then by the step's counter over the blocks: %d of %lld bytes (%lld "
                   "bytes%s)\n",
                   r->zero, nranks, nranks, r->rank, r->shard_tree.nreg, (long long)(r->shard_tree.len * 4),
                   (long long)rt_shard_tree_bytes(&r->shard_tree),
                   !r->x.gpu       ? ""
                   : r->nccl_grads ? " on the GPU; NCCL exchanges them"
                                   : " of host memory: each micro-batch's gradient staged through the host");
        else
            printf("gradient partial sums: whole-size (%s): each rank's micro-batches contiguous, summed over the ranks once a "
                   "step: %d of %lld bytes (%lld bytes)\n",
                   r->zero < 2 ? "ZeRO-2's by shard needs parallel.zero >= 2" : "ZeRO-2's by shard needs a power of two of ranks",
                   r->x.ntree - 1, (long long)(p->param_floats * 4), (long long)whole);
    }
    rt_print_device(o, &r->x);
    if (t->offload_optimizer == 1)
        printf("optimizer state: in host memory (offload { optimizer = host }: %lld bytes)%s\n", (long long)(p->state_floats * 4),
               r->x.gpu ? "; the CPU updates it: the gradients are copied down and the parameters up each step"
                        : "; on the CPU, where it is anyway");
    if (r->offload) {
        printf("optimizer state: offloaded to '%s' (%lld bytes; %s): %lld chunks of %lld parameters streamed through %lld "
               "bytes of staging buffers\n",
               rt_opt_offload_path(r->offload), (long long)rt_opt_offload_file_bytes(r->offload),
               rt_opt_offload_engine(r->offload), (long long)rt_opt_offload_nchunks(r->offload), (long long)t->offload_chunk,
               (long long)rt_opt_offload_staging_bytes(r->offload));
        if (*rt_opt_offload_note(r->offload)) printf("optimizer state: %s\n", rt_opt_offload_note(r->offload));
    }
    if (r->x.act_store) {
        printf("activations: offloaded to '%s' (%lld bytes; %s, %s) during each micro-batch's step\n",
               rt_store_path(r->x.act_store), (long long)rt_store_size(r->x.act_store),
               rt_store_uring(r->x.act_store) ? "io_uring" : "a worker thread",
               rt_store_direct(r->x.act_store) ? "O_DIRECT" : "buffered");
        if (*rt_store_note(r->x.act_store)) printf("activations: %s\n", rt_store_note(r->x.act_store));
        if (r->x.gpu) {
            printf("activations: staged through %lld bytes of pinned host memory (%d slots of %lld bytes) on a second "
                   "stream; forward_backward runs uncaptured\n",
                   (long long)rt_gpu_act_bytes(r->x.gpu), (int)(rt_gpu_act_bytes(r->x.gpu) / rt_gpu_act_slot_bytes(r->x.gpu)),
                   (long long)rt_gpu_act_slot_bytes(r->x.gpu));
            printf("activations: the staging copies measured at %.1f GB/s to the host and %.1f GB/s back (%lld bytes each "
                   "way); the plan assumed %.2f GB/s for a whole copy, to the store or back (mbtc --offload-gbps)\n",
                   r->act_gbps_out, r->act_gbps_back, (long long)r->act_rate_bytes, p->train.offload_gbps);
        }
    }
    if (p->train.offload_act == 1) {
        if (r->x.gpu) {
            printf("activations: offloaded to %lld bytes of pinned host memory, copied on a second stream during each "
                   "micro-batch's step\n",
                   (long long)rt_gpu_act_bytes(r->x.gpu));
            printf("activations: the copies measured at %.1f GB/s to the host and %.1f GB/s back (%lld bytes each way); the "
                   "plan assumed %.1f GB/s (mbtc --offload-gbps)\n",
                   r->act_gbps_out, r->act_gbps_back, (long long)r->act_rate_bytes, p->train.offload_gbps);
        } else
            printf("activations: offloaded to %lld bytes of host memory (on the CPU the copies are memcpy) during each "
                   "micro-batch's step\n",
                   (long long)p->train.offload_act_bytes);
    }
    char sources[8192];
    rt_sources_text(sources, sizeof sources, r->spec.pattern);
    printf("data: %lld windows in %lld file%s (%s)\n", (long long)rt_data_windows(r->train), (long long)rt_data_nfiles(r->train),
           rt_data_nfiles(r->train) == 1 ? "" : "s", sources);
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

/* After a step: its log line, an evaluation when one is due, a checkpoint every N steps, after
 * the last and when a signal asks the run to stop (*stop says whether one did). */
static RtStatus rt_train_after_step(RtTrainRun *r, int64_t step, const RtStepLog *sl, int *stop) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    const RtOptions *o = &r->o;
    RtStatus st = rt_log_step(&r->log, sl, &r->e);
    if (st == RT_OK && r->val && ((step + 1) % t->eval_every == 0 || step + 1 == o->steps)) {
        st = rt_train_host_flush(r); /* (forward_loss would run it too, through its reads) */
        double vl;
        int64_t used;
        int64_t batches = t->eval_steps * (t->global / t->micro);
        /* ZeRO-3: forward_loss gathers around its reads, a collective each, so every rank must
         * make as many calls; batches = eval_steps x accum x data is a multiple of the ranks, but
         * were it not, the whole region is gathered for the evaluation instead */
        int whole = r->zero3 && batches % r->nranks != 0;
        /* on the GPU the host-staged gathers send the host's copy of this rank's shard, which the
         * update has just changed on the device: made current (and the step's pages unmapped) */
        if (rt_zero3_on_gpu(r->zero3) && !whole) {
            rt_zero3_release_all(r->zero3);
            st = rt_zero3_settle(r->zero3, &r->e);
        }
        if (whole && st == RT_OK) st = rt_train_zero3_whole(r), r->x.param_hook = NULL;
        if (st == RT_OK) st = rt_evaluate(&r->x, r->val, batches, o->seed, r->nranks > 1 ? r->comm : NULL, &vl, &used, &r->e);
        if (whole) r->x.param_hook = rt_zero3_hook(r->zero3);
        if (r->zero3) { /* forward_loss's gathers (the hook cannot return a failure) */
            RtStatus zs = rt_zero3_settle(r->zero3, st == RT_OK ? &r->e : NULL);
            if (st == RT_OK) st = zs;
        }
        if (st == RT_OK) st = rt_log_eval(&r->log, step + 1, vl, used, &r->e);
    }
    /* several ranks: their agreement (rt_train_gather_losses); alone, a signal up to now */
    if (r->nranks == 1) r->stop_sig = rt_stop_signal, r->stop_rank = 0;
    *stop = r->stop_sig != 0;
    if (st == RT_OK && r->ckpt) st = rt_ckpt_report(p, o, r->ckpt, 0, r->waited, &r->log, &r->e);
    if (st != RT_OK || !(*stop || (o->ckpt_every > 0 && ((step + 1) % o->ckpt_every == 0 || step + 1 == o->steps)))) return st;
    st = rt_train_host_flush(r);               /* the checkpoint reads the host's state */
    if (r->zero) st = rt_train_zero3_whole(r); /* every rank takes part */
    if (r->zero && st == RT_OK) st = rt_train_gather_state(r);
    if (st != RT_OK || r->rank > 0) return st; /* rank 0 writes the checkpoint */
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
    /* offloaded: the state read back from the store for the checkpoint's snapshot, then freed */
    float *offloaded = NULL;
    if (st == RT_OK && r->offload) {
        offloaded = malloc((size_t)(p->state_floats + 1) * sizeof *offloaded);
        if (!offloaded) st = rt_fail_errno(&r->e, ENOMEM, "cannot read the offloaded optimizer state for a checkpoint");
        if (st == RT_OK) st = rt_opt_offload_read(r->offload, offloaded, &r->e);
    }
    if (st == RT_OK)
        st = rt_ckpt_save(r->ckpt, r->x.pool, r->x.params,
                          r->zero      ? r->state_full
                          : r->offload ? offloaded
                                       : r->x.state,
                          &info, &r->waited, &r->e);
    free(offloaded);
    if (st == RT_OK && (*stop || o->ckpt_sync)) st = rt_ckpt_report(p, o, r->ckpt, 1, r->waited, &r->log, &r->e);
    return st;
}

/* MBT_DP_MODEL_GBPS: the bucketed reduction at the program's degree modelled against the backward
 * of a step's last micro-batch (dp_reduce.h, rt_dp_model; docs/parallel.md, "The overlap model"). */
static void rt_train_print_model(RtTrainRun *r) {
    const RtTrainSettings *t = &r->p->train;
    int ranks = (int)t->data_ranks;
    double fb = r->fb_s / (double)r->fb_n, bwd = fb * 2.0 / 3.0;
    RtDpModel m;
    rt_dp_model(r->p->param_floats, r->bucket_floats, ranks, r->model_gbps, bwd, &m, NULL, "");
    printf("overlap model (MBT_DP_MODEL_GBPS=%g): %d rank%s, %d bucket%s of at most %lld floats; the backward of a step's "
           "last micro-batch taken as 2/3 of its forward and backward measured here (%.3f of %.3f ms, the mean of %lld; an "
           "assumption, as is an even rate over the parameters, last first); the buckets reduce in %.3f ms, %.3f ms after "
           "the backward: %.1f%% hidden\n",
           r->model_gbps, ranks, ranks == 1 ? "" : "s", m.nbuckets, m.nbuckets == 1 ? "" : "s", (long long)r->bucket_floats,
           1e3 * bwd, 1e3 * fb, (long long)r->fb_n, 1e3 * m.comm_s, 1e3 * m.exposed_s, 100 * m.hidden);
    rt_dp_model(r->p->param_floats, r->bucket_floats, ranks, r->model_gbps, bwd, &m, stdout, "");
}

/* ZeRO-3 after the last step: every rank's measured high-water mark of resident parameter memory
 * during its forward_backward calls (mincore, zero3.h), against the plan's bound - the rank's shard
 * plus the gathers' window (RtPlanInfo.gather_window) - and the whole region; with MBT_DEBUG the
 * gathers' counts and times. */
static RtStatus rt_train_zero3_report(RtTrainRun *r) {
    const RtProgram *p = r->p;
    double mine[4], *all = calloc((size_t)r->nranks * 4, sizeof *all);
    if (!all) return rt_fail_errno(&r->e, ENOMEM, "cannot gather the ranks' parameter memory");
    int64_t gathers, floats;
    double waited, gs;
    rt_zero3_stats(r->zero3, &gathers, &floats, &waited, &gs);
    mine[0] = (double)rt_zero3_high_water(r->zero3), mine[1] = (double)gathers, mine[2] = waited, mine[3] = gs;
    RtStatus st = rt_comm_gather_f64(r->comm, mine, 4, all, &r->e);
    if (st == RT_OK) {
        int64_t whole = p->param_floats * 4, win = p->plan.gather_window * 4, units = p->plan.gather_units;
        int64_t page = rt_zero3_page(r->zero3);
        /* the bound in the plan's pages (the runtime's page, or a multiple of it: train_dp.c) */
        int64_t pg = p->plan.gather_page > 0 ? p->plan.gather_page : page, wpages = p->plan.gather_window_pages;
        int64_t region = (whole + pg - 1) / pg;
        if (rt_zero3_on_gpu(r->zero3))
            printf("ZeRO-3: the GPU's parameter memory mapped during forward_backward (measured: pages of %lld bytes of the "
                   "reservation mapped), of the region's %lld bytes; the plan's bound is the pages of a rank's shard + the "
                   "%lld pages the gathers map at once (window %lld bytes, %lld gathers)\n",
                   (long long)page, (long long)whole, (long long)wpages, (long long)win, (long long)units);
        else
            printf("ZeRO-3: parameter memory resident during forward_backward (measured, mincore), of the region's %lld bytes; "
                   "the plan's bound is the pages of a rank's shard + the %lld pages of %lld bytes the gathers map at once "
                   "(window %lld bytes, %lld gathers)\n",
                   (long long)whole, (long long)wpages, (long long)pg, (long long)win, (long long)units);
        for (int k = 0; k < r->nranks; k++) {
            int64_t shard = (r->shard_off[k + 1] - r->shard_off[k]) * 4;
            int64_t sp = shard > 0 ? (r->shard_off[k + 1] * 4 + pg - 1) / pg - r->shard_off[k] * 4 / pg : 0;
            int64_t bound = (sp + wpages < region ? sp + wpages : region) * pg;
            double hw = all[k * 4];
            printf("ZeRO-3: rank %d: high-water %.0f bytes (%.1f%% of the region), bound %lld (shard %lld in %lld pages + "
                   "window %lld pages, of %lld bytes): %s\n",
                   k, hw, whole > 0 ? 100.0 * hw / (double)whole : 0.0, (long long)bound, (long long)shard, (long long)sp,
                   (long long)wpages, (long long)pg, hw <= (double)bound ? "within" : "ABOVE");
            if (getenv("MBT_DEBUG"))
                printf("ZeRO-3: rank %d: %.0f gathers by the hook, the step waited %.3f ms for them, %.3f ms in them\n", k,
                       all[k * 4 + 1], all[k * 4 + 2] * 1e3, all[k * 4 + 3] * 1e3);
        }
    }
    free(all);
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
    if (r->offload && done_steps > 0)
        printf("optimizer state: the updates waited %.3f s for the store in all (%.3f ms/step)\n",
               rt_opt_offload_wait_s(r->offload), rt_opt_offload_wait_s(r->offload) * 1e3 / (double)done_steps);
    if (r->x.gpu && r->host_steps > 0) { /* offload { optimizer }: what the host's updates moved (gpu_opt.c) */
        int64_t down, up;
        rt_gpu_opt_bytes(r->x.gpu, &down, &up);
        printf("optimizer offload: the host's updates copied %lld bytes down and %lld up in %lld steps (%lld and %lld a step), "
               "through %lld bytes of page-locked host memory\n",
               (long long)down, (long long)up, (long long)r->host_steps, (long long)(down / r->host_steps),
               (long long)(up / r->host_steps), (long long)r->x.pinned_bytes);
    }
    if (r->x.gpu) { /* the runtime's own high-water mark of device memory (bench/gpu.py reads it), CUDA graphs */
        char peak[32], graphs[512];
        printf("GPU: peak %s of device allocations (%lld bytes); %s\n", rt_gpu_format_bytes(rt_gpu_peak_bytes(r->x.gpu), peak),
               (long long)rt_gpu_peak_bytes(r->x.gpu), rt_gpu_graph_report(r->x.gpu, graphs, sizeof graphs));
    }
    if (r->x.act_store && done_steps > 0 && r->x.gpu) /* the store's I/O runs on the copy stream, not the host */
        printf("activations: the copy stream spent %.3f s in the store's I/O in all (%.3f ms/step)\n", rt_gpu_act_io_s(r->x.gpu),
               rt_gpu_act_io_s(r->x.gpu) * 1e3 / (double)done_steps);
    else if (r->x.act_store && done_steps > 0)
        printf("activations: the steps waited %.3f s for the store in all (%.3f ms/step)\n", r->x.act_wait_s,
               r->x.act_wait_s * 1e3 / (double)done_steps);
    if (r->x.gpu) rt_gpu_print_timing(stdout, r->x.gpu); /* MBT_DEBUG / MBT_TRACE: where the GPU's time went */
    if (r->prof) {
        rt_pool_set_profile(r->x.pool, NULL);
        rt_profile_print(stdout, r->prof, rt_pool_threads(r->x.pool));
    }
    if (r->model_gbps > 0 && r->fb_n > 0) rt_train_print_model(r);
    if (r->zero3 && done_steps > 0) {
        st = rt_train_zero3_report(r);
        if (st != RT_OK) return st;
    }
    if (r->zero3 && (r->given->save_weights || r->given->save_adapter)) { /* every rank */
        st = rt_train_zero3_whole(r);
        if (st != RT_OK) return st;
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
            char whose[48] = "";
            if (r->nranks > 1) snprintf(whose, sizeof whose, " (to rank %d; every rank stops here)", r->stop_rank);
            printf("stopped by %s%s after step %lld; resume with: %s train --resume latest%s%s\n",
                   r->stop_sig == SIGINT ? "SIGINT" : "SIGTERM", whose, (long long)(step + 1), o->prog,
                   own_dir ? "" : " --ckpt-dir ", own_dir ? "" : o->ckpt_dir);
            return RT_OK;
        }
    }
    RtStatus st = rt_train_host_flush(r); /* the run's weights and state are read from here on */
    return st == RT_OK ? rt_train_finish(r, first_step, done_steps, total_tokens, t_run, last_loss) : st;
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
    free(r->micro_loss);
    free(r->all_loss);
    free(r->shard_off);
    free(r->pcast_off);
    free(r->shard_got);
    free(r->zero_scratch);
    free(r->loss_order);
    if (r->shard_tree.ops) /* the device's regions (over NCCL) */
        for (int i = 0; i < r->shard_tree.nreg; i++) rt_gpu_free(r->x.gpu, r->shard_tree.reg[i]);
    rt_shard_tree_close(&r->shard_tree);
    free(r->state_full);
    free(r->norm_all);
    rt_dp_reduce_close(r->buckets);
    rt_dp_reduce_close(r->zbuckets);
    rt_train_gpu_buckets_close(r);
    free(r->dump_x);
    free(r->stat_x);
    free(r->stat_y);
    free(r->stat_mine);
    free(r->stat_all);
    free(r->dump_y);
    free(r->dump_p);
    free(r->dump_g);
    free(r->defer.done);
    rt_opt_offload_close(r->offload); /* removes the store file */
    if (r->d_shard_got) rt_gpu_free(r->x.gpu, r->d_shard_got);
    if (r->comm) {
        RtError e;
        rt_comm_set_gpu(r->comm, NULL, &e); /* NCCL's communicator before the GPU it runs on */
    }
    rt_zero3_close(r->zero3, &r->x.params);
    rt_exec_close(&r->x);
    free(r->prof);
    rt_data_close(r->val);
    rt_data_close(r->train);
}

int rt_cmd_train(const RtProgram *p, const RtOptions *o) {
    RtTrainRun r = {.p = p, .given = o, .o = *o, .window = p->train.micro * p->train.seq, .ckpt_lock = -1, .nranks = 1};
    rt_error_clear(&r.e);
    char prog[256];
    int agreed = 0;
    RtStatus st = rt_train_world(&r, prog, sizeof prog, &agreed);
    if (st == RT_OK) st = rt_train_open(&r);
    if (st == RT_OK) {
        rt_train_banner(&r);
        st = rt_train_loop(&r, r.o.resume ? r.resumed.step : 0);
    }
    if (r.comm) { /* MBT_DEBUG, MBT_TRACE */
        rt_comm_print_timing(rt_comm_rank(r.comm) == 0 ? stdout : stderr, r.comm);
        const char *dbg = getenv("MBT_DEBUG"); /* as the table's: a number, 1 or more */
        if (dbg && atoi(dbg) >= 1) {
            char pre[32];
            snprintf(pre, sizeof pre, "[rank %d] ", rt_comm_rank(r.comm));
            rt_dp_reduce_print(rt_comm_rank(r.comm) == 0 ? stdout : stderr, r.buckets, pre);
            rt_dp_reduce_print(rt_comm_rank(r.comm) == 0 ? stdout : stderr, r.zbuckets, pre);
            rt_train_gpu_buckets_print(&r, rt_comm_rank(r.comm) == 0 ? stdout : stderr, pre);
        }
        const char *trace;
        RtError te;
        if (rt_comm_trace_write(r.comm, &trace, &te) != RT_OK) fprintf(stderr, "%s: warning: %s\n", r.o.prog, te.msg);
    }
    rt_train_close(&r);
    int rank = r.comm ? rt_comm_rank(r.comm) : 0;
    if (st != RT_OK && !(agreed && rank > 0)) rt_report(&r.o, &r.e);
    /* a rank that failed stops the others (they would wait for it until the timeout); a failure
     * every rank saw alike ends each of them cleanly */
    if (st != RT_OK && !agreed && r.comm && rt_comm_size(r.comm) > 1) rt_comm_abort(r.comm, 1);
    rt_comm_close(r.comm);
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
    if (st == RT_OK) st = rt_evaluate(&x, val, o->steps * (t->global / t->micro), o->seed, NULL, &loss, &used, &e);
    if (st == RT_OK) {
        char sources[8192];
        rt_sources_text(sources, sizeof sources, spec.val_pattern && *spec.val_pattern ? spec.val_pattern : spec.pattern);
        printf("eval %s: loss %.6f (perplexity %.4g) on %lld batches of %lld x %lld tokens from %s\n", t->name, loss, exp(loss),
               (long long)used, (long long)t->micro, (long long)t->seq, sources);
        code = 0;
    } else {
        rt_report(o, &e);
    }
    rt_exec_close(&x);
    rt_data_close(val);
    return code;
}
