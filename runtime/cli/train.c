/* train.c - the executable's driver: rt_main, the memory of a run, the train loop and evaluation
 * (see rt_exec.h; docs/runtime.md, "The train loop").
 *
 * Pipeline position: the top of every executable. runtime/main.c hands rt_main the program's
 * descriptor (rt_program.h); rt_main checks it, parses the command line (cli.c) and runs a
 * command. Training, per optimizer step:
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

#include "comm.h"
#include "dp_reduce.h"
#include "rt_exec.h"
#include "rt_offload.h"
#include "rt_store.h"
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
    if (t->ncurriculum < 0 || (t->ncurriculum > 0 && (!t->curriculum || !t->curriculum_lens || t->docs < 0)))
        return rt_fail(err, RT_ERR_ARG, "batch: ncurriculum is %lld (0 or more, with its tables and documents when above 0)",
                       (long long)t->ncurriculum);
    for (int64_t i = 0, nl = 0; i < t->ncurriculum; i++) {
        const int64_t *c = t->curriculum + 3 * i;
        if (c[0] < 0 || (i > 0 && c[0] <= c[-3]) || c[1] != nl || c[2] < 1)
            return rt_fail(err, RT_ERR_ARG, "batch: curriculum stage %lld (step %lld, lengths %lld..+%lld) is out of order",
                           (long long)(i + 1), (long long)c[0], (long long)c[1], (long long)c[2]);
        for (int64_t j = 0; j < c[2]; j++, nl++)
            if (t->curriculum_lens[nl] < 1 || t->seq % t->curriculum_lens[nl] != 0)
                return rt_fail(err, RT_ERR_ARG, "batch: curriculum length %lld does not divide seq %lld",
                               (long long)t->curriculum_lens[nl], (long long)t->seq);
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

/* Shard boundaries fall on multiples of the gradient norm's blocks (RT_GRAD_BLOCK), so that each
 * block's sum of squares is one rank's, whatever the number of ranks. */
#define RT_SHARD_ALIGN RT_GRAD_BLOCK

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
    RtComm *comm;   /* the world of ranks (runtime/comm/comm.h): one rank unless a launcher started several */
    /* data parallelism (docs/parallel.md): this process is rank `rank` of `nranks` (the world's) */
    int rank, nranks;
    double *micro_loss; /* this rank's micro-batches' losses, the largest accum of the ramp, + 1 */
    double *all_loss;   /* every rank's, in rank order: (accum + 1) x nranks, then accum x nranks */
    /* the signal that stops the run after this step (0: none), and the rank it came to: with
     * several ranks every rank's pending signal travels with the losses' gather, so that all of
     * them stop after the same step (rt_train_gather_losses) */
    int stop_sig, stop_rank;
    int64_t *shard_off; /* nranks + 1 shard boundaries of the gradient (rt_comm_shards) */
    float *shard_got;   /* every rank's copy of this rank's shard (rt_comm_exchange_shards) */
    /* ZeRO (parallel { zero }, docs/parallel.md): with several ranks, 1 or 2; this rank's
     * optimizer state is its shard alone, [shard_off[rank], shard_off[rank + 1]) of each variable */
    int zero;
    float *zero_scratch;   /* one vector of param_floats: a state variable gathered for a checkpoint */
    float *state_full;     /* rank 0: the whole optimizer state, gathered for a checkpoint */
    double *norm_all;      /* ZeRO-2: every rank's gradient-norm blocks, rank after rank */
    RtDpReduce *buckets;   /* the gradient reduced in buckets by a communication thread (dp_reduce.h), or NULL */
    int64_t bucket_floats; /* MBT_DP_BUCKET_MB's */
    /* the buckets overlapped with the backward of the step's last micro-batch (MBT_DP_OVERLAP,
     * default on; the CPU alone): the generated code's rt_grad_ready calls hook, which marks the
     * range ready in buckets; fold_tree is the local tree the thread folds each bucket of */
    int overlap;
    RtGradHook hook;
    RtTree fold_tree;
    double model_gbps;   /* MBT_DP_MODEL_GBPS: the overlap model's link bandwidth, 0 for none */
    double fb_s;         /* the micro-batches' forward_backward time (for the model) */
    int high_water_done; /* --arena-high-water: measured (the first step this process runs) */
    int64_t fb_n;
    /* global_mean: the step's micro-batches of this rank, read once for the statistics pass and kept
     * for the step's own pass (rt_train_stats); stat_cap micro-batches; stat_mine their statistics
     * (accum x stat_floats), stat_all every rank's (rank order, which is micro-batch order) */
    int32_t *stat_x, *stat_y;
    int64_t stat_cap;
    double *stat_mine, *stat_all;
    /* offload { optimizer = nvme } (docs/memory.md): the optimizer state in a store file; x.state
     * is then NULL, and a checkpoint reads the state back into a buffer of its own */
    RtOptOffload *offload;
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
        /* --save-weights and --dump-step are written to a temporary file renamed over the path,
         * which would replace a FIFO or a device node (/dev/null) with a regular file; --log
         * (what == NULL) is a stream, and may go to a pipe or a device (rt_log_open). */
        if (what && !S_ISREG(so.st_mode))
            return rt_fail(err, RT_ERR_ARG,
                           "%s '%s' is %s, not a regular file: the %s is written to a temporary file renamed over the path, "
                           "which would replace it",
                           flag, path, rt_file_kind(so.st_mode), what);
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
    /* rank 0 writes the checkpoints (docs/parallel.md): the others neither claim nor write them */
    if (st == RT_OK && r->rank == 0) st = rt_ckpt_dir_claim(o->ckpt_dir, required, &r->ckpt_lock, &r->e);
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

static RtStatus rt_train_shard_state(RtTrainRun *r);

/* The step's tree of partial sums and the micro-batches' losses, for the largest accumulation of
 * the batch ramp. */
/* rt_grad_ready's hook (RtGradHook): elements [lo, hi) of the gradient have their last addition
 * of the step's last micro-batch. */
static void rt_train_grad_ready(void *ctx, int64_t lo, int64_t hi) { rt_dp_reduce_ready(((RtTrainRun *)ctx)->buckets, lo, hi); }

/* The bucket's elements made this rank's final sum, on the communication thread: the local
 * tree's additions after the last micro-batch, over [lo, hi). */
static void rt_train_fold(void *ctx, int64_t lo, int64_t hi) {
    RtTrainRun *r = ctx;
    rt_exec_tree_fold_range(&r->x, &r->fold_tree, lo, hi);
}

/* MBT_DP_OVERLAP (1, the default, or 0): whether the buckets start during the backward of the
 * step's last micro-batch. The GPU keeps the reduction after the backward: its gradient adds are
 * queued on a stream and the reduction stages the whole gradient through the host. A bucket is
 * ready once every parameter's range in it was announced (a parameter whose gradient the program
 * never writes, a zero gradient, holds its bucket until the backward ends). */
static RtStatus rt_train_overlap_open(RtTrainRun *r) {
    const char *s = getenv("MBT_DP_OVERLAP");
    r->overlap = 1;
    if (s && *s) {
        if (strcmp(s, "0") && strcmp(s, "1"))
            return rt_fail(&r->e, RT_ERR_ARG, "MBT_DP_OVERLAP is '%s': it must be 1 (the default) or 0", s);
        r->overlap = s[0] == '1';
    }
    if (r->x.gpu) r->overlap = 0;
    if (!r->overlap) return RT_OK;
    const RtProgram *p = r->p;
    int64_t *lo = malloc((size_t)(p->nparams + 1) * sizeof *lo), *hi = malloc((size_t)(p->nparams + 1) * sizeof *hi);
    if (!lo || !hi) {
        free(lo), free(hi);
        return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the parameters' ranges");
    }
    for (int64_t i = 0; i < p->nparams; i++) lo[i] = p->params[i].offset, hi[i] = p->params[i].offset + p->params[i].numel;
    rt_dp_reduce_expect(r->buckets, lo, hi, (int)p->nparams);
    free(lo), free(hi);
    r->hook = (RtGradHook){rt_train_grad_ready, r};
    return RT_OK;
}

static RtStatus rt_train_tree_alloc(RtTrainRun *r) {
    const RtTrainSettings *t = &r->p->train;
    int64_t accum = t->accum;
    for (int64_t i = 0; i < t->nramp; i++)
        if (t->ramp[i].accum > accum) accum = t->ramp[i].accum;
    accum = accum * t->data_ranks / r->nranks; /* this process's micro-batches a step, at most */
    RtStatus st = rt_exec_tree_open(&r->x, accum, &r->e);
    if (st != RT_OK) return st;
    r->micro_loss = calloc((size_t)accum + 1, sizeof *r->micro_loss);
    r->all_loss = calloc((size_t)((accum + 1) * r->nranks), sizeof *r->all_loss);
    if (!r->micro_loss || !r->all_loss) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the micro-batches' losses");
    st = rt_dp_bucket_env(&r->bucket_floats, &r->e);
    if (st == RT_OK) st = rt_dp_model_env(&r->model_gbps, &r->e);
    if (st != RT_OK || r->nranks == 1) return st;
    r->shard_off = calloc((size_t)r->nranks + 1, sizeof *r->shard_off);
    if (!r->shard_off) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    rt_comm_shards(r->p->param_floats, r->nranks, RT_SHARD_ALIGN, r->shard_off);
    int64_t len = r->shard_off[r->rank + 1] - r->shard_off[r->rank];
    r->shard_got = calloc((size_t)(len * r->nranks) + 1, sizeof *r->shard_got);
    if (!r->shard_got) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient's shards");
    r->zero = (int)t->zero;
    if (r->zero && r->x.gpu)
        return rt_fail(&r->e, RT_ERR_ARG,
                       "parallel.zero = %d runs on the CPU: the GPU's optimizer_update does not take a shard yet (--device cpu, "
                       "or zero = 0)",
                       r->zero);
    /* the reduction in buckets by a thread (not with ZeRO-2, whose rank keeps its shard of the
     * whole vector alone; nor for one bucket, where the thread would only add a hand-over) */
    if (r->zero < 2 && r->p->param_floats > r->bucket_floats) {
        st = rt_dp_reduce_open(&r->buckets, r->comm, r->x.pool, r->p->param_floats, r->bucket_floats, &r->e);
        if (st != RT_OK) return st;
        st = rt_train_overlap_open(r);
        if (st != RT_OK) return st;
    }
    if (r->zero == 2) {
        r->norm_all = calloc((size_t)(rt_exec_grad_blocks(r->p) * r->nranks) + 1, sizeof *r->norm_all);
        if (!r->norm_all) return rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient norm's blocks");
    }
    return r->zero ? rt_train_shard_state(r) : RT_OK;
}

/* offload { optimizer = nvme }: the state (initialised, resumed, or zero) moved into a store file
 * in --offload-dir, and its memory freed. One file a process, named for the program's train block,
 * the process and the rank, so that runs and ranks sharing a directory never share a file. */
static RtStatus rt_train_offload_open(RtTrainRun *r) {
    const RtProgram *p = r->p;
    if (r->x.gpu)
        return rt_fail(&r->e, RT_ERR_ARG,
                       "offload { optimizer = nvme } runs on the CPU alone: the GPU's update does not stream its state "
                       "(--device cpu)");
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
    if (st == RT_OK && p->train.offload_optimizer == 2) st = rt_train_offload_open(r);
    if (st == RT_OK && p->train.offload_act_bytes > 0) { /* offload { activations = nvme }: its store, like the optimizer's */
        char name[256];
        snprintf(name, sizeof name, "mbt-%s-%ld-rank%d.activations", p->train.name, (long)getpid(), r->rank);
        for (char *c = name; *c; c++)
            if (*c == '/') *c = '_';
        st = rt_exec_act_open(&r->x, o->offload_dir, name, &r->e);
    }
    if (st == RT_OK) st = rt_exec_push(&r->x, &r->e);
    int64_t nblocks = rt_exec_grad_blocks(p);
    if (st == RT_OK) {
        r->partial = calloc(nblocks > 0 ? (size_t)nblocks : 1, sizeof *r->partial);
        if (!r->partial) st = rt_fail_errno(&r->e, ENOMEM, "cannot allocate the gradient-norm blocks");
    }
    if (st == RT_OK && o->dump_step) st = rt_train_dump_alloc(r);
    if (st == RT_OK) st = rt_train_tree_alloc(r);
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
    if (r->zero)
        printf("ZeRO-%d: this rank holds and updates elements [%lld, %lld) of the optimizer state%s; the updated "
               "parameters are gathered\n",
               r->zero, (long long)r->shard_off[r->rank], (long long)r->shard_off[r->rank + 1],
               r->zero == 2 ? " and keeps that shard alone of the summed gradient" : "");
    else if (t->zero) printf("ZeRO-%lld: one process holds every shard\n", (long long)t->zero);
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

/* v[0, n) summed in place by the step's tree (rt_exec.h, RtTree): a binary counter over the
 * indices, the older sum on the left, and what is left folded from the right. The sum is in v[0].
 * The gradient's regions (rt_exec_tree_*), the ranks' shards (rt_train_reduce) and the step's loss
 * are all summed by this one shape, so each is a function of the number of micro-batches alone. */
static double rt_tree_sum_f64(double *v, int64_t n) {
    int64_t at[RT_TREE_MAX + 1], size[RT_TREE_MAX + 1];
    int d = 0;
    for (int64_t i = 0; i < n; i++) {
        at[d] = i, size[d++] = 1;
        while (d >= 2 && size[d - 1] == size[d - 2]) v[at[d - 2]] += v[at[d - 1]], size[d - 2] *= 2, d--;
    }
    while (d >= 2) v[at[d - 2]] += v[at[d - 1]], size[d - 2] += size[d - 1], d--;
    return n > 0 ? v[0] : 0;
}

/* ---- global_mean: the statistics pass (docs/runtime.md, "Statistics over the global batch") ---- */

/* Reads this rank's accum micro-batches of the step (the global batch's [first, first + accum);
 * the data stand at the first) into stat_x/stat_y, runs forward_stats on each, and sets the
 * statistics to the mean over all M = accum x ranks micro-batches of the step: every micro-batch's
 * statistics are gathered from the ranks (rt_comm_gather_f64, rank order, which is micro-batch
 * order), summed in double in micro-batch order, divided by M, stored as f32 (and uploaded to the
 * GPU) - the same numbers at any number of ranks. The step's forward and backward then read the
 * same micro-batches back (rt_train_read). Nothing without statistics. */
static RtStatus rt_train_stats(RtTrainRun *r, int64_t step, int64_t accum, int64_t first, int64_t M) {
    const RtProgram *p = r->p;
    int64_t sf = p->stat_floats;
    if (sf <= 0) return RT_OK;
    RtExec *x = &r->x;
    if (accum > r->stat_cap) {
        free(r->stat_x);
        free(r->stat_y);
        free(r->stat_mine);
        free(r->stat_all);
        r->stat_x = malloc((size_t)(accum * r->window) * sizeof *r->stat_x);
        r->stat_y = malloc((size_t)(accum * r->window) * sizeof *r->stat_y);
        r->stat_mine = malloc((size_t)(accum * sf) * sizeof *r->stat_mine);
        r->stat_all = malloc((size_t)(accum * r->nranks * sf) * sizeof *r->stat_all);
        r->stat_cap = r->stat_x && r->stat_y && r->stat_mine && r->stat_all ? accum : 0;
        if (!r->stat_cap) return rt_fail(&r->e, RT_ERR_NOMEM, "cannot allocate the step's %lld micro-batches", (long long)accum);
    }
    RtStatus st = RT_OK;
    for (int64_t m = 0; m < accum && st == RT_OK; m++) {
        int32_t *bx = r->stat_x + m * r->window, *by = r->stat_y + m * r->window;
        st = rt_data_next(r->train, p->train.micro, bx, by, &r->e);
        if (st != RT_OK) break;
        memcpy(x->x, bx, (size_t)r->window * sizeof *bx);
        memcpy(x->y, by, (size_t)r->window * sizeof *by);
        st = rt_exec_batch(x, r->window, &r->e);
        RtStep s = rt_exec_step(x, &r->e);
        s.B = p->train.micro, s.T = p->train.seq, s.step = step, s.micro = first + m, s.seed = r->o.seed;
        s.training = 1; /* forward_backward's key: its dropout masks, training() = 1 */
        if (st == RT_OK) st = rt_exec_call(x, RT_EXEC_FORWARD_STATS, &s);
        if (st != RT_OK) {
            rt_error_context(&r->e, "step %lld, statistics of micro-batch %lld", (long long)(step + 1),
                             (long long)(first + m + 1));
            break;
        }
        for (int64_t i = 0; i < sf; i++) r->stat_mine[m * sf + i] = (double)x->stats_out[i];
    }
    double *all = r->stat_mine;
    if (st == RT_OK && r->nranks > 1) {
        all = r->stat_all;
        st = rt_comm_gather_f64(r->comm, r->stat_mine, accum * sf, all, &r->e);
        if (st != RT_OK) rt_error_context(&r->e, "step %lld: gathering the statistics", (long long)(step + 1));
    }
    for (int64_t i = 0; st == RT_OK && i < sf; i++) {
        double sum = 0;
        for (int64_t m = 0; m < M; m++) sum += all[m * sf + i];
        x->stats[i] = (float)(sum / (double)M);
    }
    if (st == RT_OK) st = rt_exec_stats(x, &r->e);
    return st;
}

/* Micro-batch m of this rank's step: from the statistics pass's copy when there is one, else the data. */
static RtStatus rt_train_read(RtTrainRun *r, int64_t m, int32_t *x, int32_t *y, RtError *err) {
    if (r->p->stat_floats <= 0) return rt_data_next(r->train, r->p->train.micro, x, y, err);
    memcpy(x, r->stat_x + m * r->window, (size_t)r->window * sizeof *x);
    memcpy(y, r->stat_y + m * r->window, (size_t)r->window * sizeof *y);
    return RT_OK;
}

/* This process's `accum` micro-batches of one step: forward and backward of each into the step's
 * tree of partial sums (rt_exec_tree_*), so that afterwards the gradient region holds their sum;
 * each one's loss goes to r->micro_loss. The global batch is M = accum x nranks micro-batches,
 * numbered in the order of the data; rank r computes [r x accum, (r + 1) x accum) and skips the windows of
 * the others, so every rank leaves the data where the whole step ends (docs/parallel.md). Each
 * next batch is read while the GPU runs the one before (exec.c: the GPU has two pairs of batch
 * buffers). */
static RtStatus rt_train_micro_batches(RtTrainRun *r, int64_t step, int64_t accum) {
    const RtTrainSettings *t = &r->p->train;
    RtExec *x = &r->x;
    int64_t M = accum * r->nranks, first = r->rank * accum;
    RtError enext;
    rt_data_skip(r->train, first * t->micro);
    RtStatus next = rt_train_stats(r, step, accum, first, M);
    if (next != RT_OK) return next;
    next = rt_train_read(r, 0, x->x, x->y, &enext);
    RtTree tree = {0};
    for (int64_t m = 0; m < accum; m++) {
        RtStatus st = next;
        if (st != RT_OK) r->e = enext;
        if (st == RT_OK) st = rt_exec_batch(x, r->window, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld", (long long)(step + 1));
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_DATA);
        RtStep s = rt_exec_step(x, &r->e);
        float *leaf = NULL;
        st = rt_exec_tree_leaf(x, &tree, &leaf, &r->e);
        s.grads = leaf;
        /* micro: the micro-batch's index in the global batch, so that a random draw keyed by it is
         * the same at any number of ranks */
        s.B = t->micro, s.T = t->seq, s.loss_scale = 1.0 / (double)M, s.step = step, s.micro = first + m, s.seed = r->o.seed;
        /* the step's last micro-batch: its backward starts the buckets' reduction (the tree as it
         * stands before this leaf is what the thread folds each bucket by) */
        int overlapped = st == RT_OK && r->overlap && m + 1 == accum;
        if (overlapped) {
            r->fold_tree = tree;
            s.grad_hook = &r->hook;
            rt_dp_reduce_begin(r->buckets, x->grads, rt_train_fold, r);
        }
        double fb0 = rt_now();
        if (st == RT_OK) st = rt_exec_queue(x, RT_EXEC_FORWARD_BACKWARD, &s);
        if (st == RT_OK && m + 1 < accum) {
            rt_exec_flip(x);
            next = rt_train_read(r, m + 1, x->x, x->y, &enext);
        }
        if (st == RT_OK) st = rt_exec_wait(x, &r->e); /* s.loss is set */
        r->fb_s += rt_now() - fb0, r->fb_n++;         /* (the next batch's read included, when there is one) */
        if (st != RT_OK)
            return rt_error_context(&r->e, "step %lld, micro-batch %lld", (long long)(step + 1), (long long)(first + m + 1));
        if (r->prof) rt_profile_phase(r->prof, RT_PROF_FB);
        if (!isfinite(s.loss))
            return rt_fail(&r->e, RT_ERR_ARG, "step %lld, micro-batch %lld: the loss is %s; stopping", (long long)(step + 1),
                           (long long)(first + m + 1),
                           isnan(s.loss) ? "nan"
                           : s.loss > 0  ? "inf"
                                         : "-inf");
        r->micro_loss[m] = s.loss;
        if (overlapped) { /* the thread folds the tree bucket by bucket: it is finished */
            tree.depth = 1, tree.size[0] = accum;
            continue;
        }
        st = rt_exec_tree_push(x, &tree, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient's partial sums", (long long)(step + 1));
    }
    RtStatus st = rt_exec_tree_finish(x, &tree, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient's partial sums", (long long)(step + 1));
    rt_data_skip(r->train, (M - first - accum) * t->micro);
    return RT_OK;
}

/* Every rank's micro-batch losses, rank 0's first, into *all (this rank's alone when it is the
 * only one). The stop signal rides along: each rank appends the signal it has seen (0: none) to
 * its losses, and every rank takes the first nonzero one in rank order, so that all of them agree
 * to stop after this step (a signal that comes to one rank, or to each at a slightly different
 * time, stops them all after the same step; docs/parallel.md). One double a rank a step: no
 * collective of its own. */
static RtStatus rt_train_gather_losses(RtTrainRun *r, int64_t accum, double **all) {
    if (r->nranks == 1) { /* (alone the signal is read after the step: rt_train_after_step) */
        *all = r->micro_loss;
        return RT_OK;
    }
    *all = r->all_loss;
    r->micro_loss[accum] = (double)rt_stop_signal;
    RtStatus st = rt_comm_gather_f64(r->comm, r->micro_loss, accum + 1, r->all_loss, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "gathering the step's losses");
    r->stop_sig = 0;
    for (int k = 0; k < r->nranks; k++) {
        int ks = (int)r->all_loss[k * (accum + 1) + accum];
        if (ks && !r->stop_sig) r->stop_sig = ks, r->stop_rank = k;
        /* the losses alone, rank after rank (the destination never passes the source) */
        memmove(r->all_loss + k * accum, r->all_loss + k * (accum + 1), (size_t)accum * sizeof *r->all_loss);
    }
    return RT_OK;
}

/* The step's gradient summed over the ranks (nothing to do with one rank): each rank receives
 * every rank's partial sum of its shard (rt_comm_exchange_shards, rank order = micro-batch order),
 * sums them by the step's tree over the ranks, and the summed shards are gathered back so that
 * every rank holds the whole gradient. With accum a power of two each rank's partial sum is a
 * node of the one tree over the step's M micro-batches, and the tree over the ranks is the rest
 * of that tree: the gradient is the bits one process gets (docs/parallel.md). On the GPU the
 * gradient goes through host memory. */
static RtStatus rt_train_reduce(RtTrainRun *r, int64_t step) {
    if (r->nranks == 1) return RT_OK;
    RtExec *x = &r->x;
    int64_t n = r->p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    RtStatus st = rt_exec_pull(x, RT_PULL_GRADS, &r->e);
    if (st == RT_OK && r->buckets && r->overlap) { /* started during the last backward: its end */
        st = rt_dp_reduce_finish(r->buckets, &r->e);
    } else if (st == RT_OK && r->buckets) { /* zero < 2: the whole sum on every rank, bucket by bucket */
        st = rt_dp_reduce_run(r->buckets, x->grads, &r->e);
    } else if (st == RT_OK) {
        st = rt_comm_exchange_shards(r->comm, x->grads, r->shard_off, r->shard_got, &r->e);
    }
    if (st == RT_OK && !r->buckets) {
        rt_dp_tree_sum_f32(x->pool, r->shard_got, r->nranks, len);
        if (len > 0) memcpy(x->grads + lo, r->shard_got, (size_t)len * sizeof *x->grads);
        /* ZeRO-2 keeps its shard of the summed gradient alone (but for --dump-step's step 1, which
         * writes all of it; r->given is the same on every rank) */
        if (r->zero < 2 || (r->given->dump_step && step == 0)) st = rt_comm_gather_shards(r->comm, x->grads, r->shard_off, &r->e);
    }
    if (st == RT_OK && x->gpu) st = rt_gpu_upload(x->gpu, x->d_grads, x->grads, n * 4, &r->e);
    return st == RT_OK ? st : rt_error_context(&r->e, "step %lld: summing the gradient over the ranks", (long long)(step + 1));
}

/* The step's loss: the mean of its M micro-batches' losses, summed by the step's tree over all of
 * them (every rank's, gathered in rank order, i.e. in micro-batch order), so that it does not
 * depend on the number of ranks. */
static RtStatus rt_train_step_loss(RtTrainRun *r, int64_t accum, double *loss) {
    int64_t M = accum * r->nranks;
    double *all = r->micro_loss;
    RtStatus st = rt_train_gather_losses(r, accum, &all);
    if (st != RT_OK) return st;
    for (int64_t m = 0; m < M; m++) all[m] *= 1.0 / (double)M;
    *loss = rt_tree_sum_f64(all, M);
    return RT_OK;
}

/* --dump-step: the whole global batch of step 1 (every rank's micro-batches, in order), read again
 * from where the step starts, so that the dump is the same file at any number of ranks. */
static RtStatus rt_train_dump_batches(RtTrainRun *r, int64_t nmicro) {
    const RtTrainSettings *t = &r->p->train;
    RtDataPos at = rt_data_tell(r->train);
    RtStatus st = RT_OK;
    for (int64_t m = 0; st == RT_OK && m < nmicro; m++)
        st = rt_data_next(r->train, t->micro, r->dump_x + m * r->window, r->dump_y + m * r->window, &r->e);
    if (st == RT_OK) st = rt_data_seek(r->train, &at, &r->e);
    return st == RT_OK ? st : rt_error_context(&r->e, "step 1: reading the batch to dump");
}

/* ZeRO-2's gradient norm: this rank's blocks of RT_GRAD_BLOCK elements (its shard is whole blocks,
 * RT_SHARD_ALIGN), every rank's gathered, and block b taken from the rank that holds it, summed in
 * block order: the sum rt_exec_grad_norm makes of the whole gradient. */
static RtStatus rt_train_shard_norm(RtTrainRun *r, double *norm) {
    int64_t nblocks = rt_exec_grad_blocks(r->p), lo = r->shard_off[r->rank], hi = r->shard_off[r->rank + 1];
    memset(r->partial, 0, (size_t)nblocks * sizeof *r->partial);
    rt_exec_grad_norm_blocks(&r->x, r->partial, lo / RT_GRAD_BLOCK, (hi + RT_GRAD_BLOCK - 1) / RT_GRAD_BLOCK);
    RtStatus st = rt_comm_gather_f64(r->comm, r->partial, nblocks, r->norm_all, &r->e);
    if (st != RT_OK) return st;
    double sumsq = 0;
    int owner = 0;
    for (int64_t b = 0; b < nblocks; b++) {
        while (owner + 1 < r->nranks && r->shard_off[owner + 1] <= b * RT_GRAD_BLOCK) owner++;
        sumsq += r->norm_all[owner * nblocks + b];
    }
    *norm = sqrt(sumsq);
    return RT_OK;
}

/* ZeRO: the optimizer state becomes this rank's shard of each variable (after it was read whole
 * from a checkpoint or initialised), the layout optimizer_update takes with RtStep.lo/hi. */
static RtStatus rt_train_shard_state(RtTrainRun *r) {
    const RtProgram *p = r->p;
    int64_t n = p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    if (p->state_floats != p->nstate * n)
        return rt_fail(&r->e, RT_ERR_ARG, "parallel.zero: the optimizer state is %lld floats, not %lld variables of %lld",
                       (long long)p->state_floats, (long long)p->nstate, (long long)n);
    float *shard = malloc((size_t)(p->nstate * len + 1) * sizeof *shard);
    r->zero_scratch = malloc((size_t)(n + 1) * sizeof *r->zero_scratch);
    if (!shard || !r->zero_scratch) {
        free(shard);
        return rt_fail_errno(&r->e, ENOMEM, "parallel.zero: cannot allocate the optimizer state's shard");
    }
    for (int64_t j = 0; j < p->nstate; j++)
        if (len > 0) memcpy(shard + j * len, r->x.state + j * n + lo, (size_t)len * sizeof *shard);
    free(r->x.state);
    r->x.state = shard;
    return RT_OK;
}

/* ZeRO, before a checkpoint: every rank's shard of each state variable gathered, so that rank 0
 * holds the whole state in r->state_full (the checkpoint is written once, whole, by rank 0). */
static RtStatus rt_train_gather_state(RtTrainRun *r) {
    const RtProgram *p = r->p;
    int64_t n = p->param_floats, lo = r->shard_off[r->rank], len = r->shard_off[r->rank + 1] - lo;
    if (r->rank == 0 && !r->state_full) {
        r->state_full = malloc((size_t)(p->state_floats + 1) * sizeof *r->state_full);
        if (!r->state_full) return rt_fail_errno(&r->e, ENOMEM, "cannot gather the optimizer state for a checkpoint");
    }
    for (int64_t j = 0; j < p->nstate; j++) {
        if (len > 0) memcpy(r->zero_scratch + lo, r->x.state + j * len, (size_t)len * sizeof *r->zero_scratch);
        RtStatus st = rt_comm_gather_shards(r->comm, r->zero_scratch, r->shard_off, &r->e);
        if (st != RT_OK) return rt_error_context(&r->e, "gathering the optimizer state for a checkpoint");
        if (r->rank == 0) memcpy(r->state_full + j * n, r->zero_scratch, (size_t)n * sizeof *r->state_full);
    }
    return RT_OK;
}

/* offload { optimizer = host } on the GPU: the clipped gradient copied down, the CPU's
 * optimizer_update over the host's parameters (the f32 master copy) and state on the thread pool,
 * the parameters copied up. *s carries lr, t, step and seed (docs/memory.md). */
static RtStatus rt_train_host_update(RtTrainRun *r, const RtStep *s) {
    RtExec *x = &r->x;
    RtStatus st = rt_exec_pull(x, RT_PULL_GRADS, &r->e);
    if (st != RT_OK) return st;
    RtStep h = {.pool = x->pool,
                .params = x->params,
                .grads = x->grads,
                .state = x->state,
                .arena = x->arena,
                .lr = s->lr,
                .t = s->t,
                .step = s->step,
                .seed = s->seed,
                .err = &r->e};
    st = r->p->optimizer_update(&h);
    return st == RT_OK ? rt_exec_push(x, &r->e) : st; /* the parameters (no state on the device) */
}

/* One optimizer step: its micro-batches, the gradient norm and clipping, the update, and with
 * --dump-step the dump of step 1. The step's log record comes back in *sl. */
static RtStatus rt_train_step(RtTrainRun *r, int64_t step, RtStepLog *sl) {
    const RtProgram *p = r->p;
    const RtTrainSettings *t = &p->train;
    RtExec *x = &r->x;
    double t0 = rt_now();
    /* this step's batch: its ramp stage; accum micro-batches on each of the ranks */
    RtRampStage stage = rt_train_stage(t, step);
    int64_t nmicro = stage.accum * t->data_ranks;
    double mult = p->lr_schedule(step), lr = t->lr * mult, loss = 0, norm = 0;
    if (!isfinite(lr))
        return rt_fail(&r->e, RT_ERR_ARG, "step %lld: the learning-rate schedule gave %g", (long long)(step + 1), mult);
    RtStatus st = r->dump_x && step == 0 ? rt_train_dump_batches(r, nmicro) : RT_OK;
    /* a process runs nmicro / nranks of them: all of them alone, accum with one process a rank */
    int64_t local = nmicro / r->nranks;
    /* the curriculum's length for this step: the same micro x seq tokens read as windows of that
     * length (data.pos restarts every x->row tokens); evaluation and generation keep seq */
    x->row = rt_train_seq_len(t, step);
    int measure = r->o.arena_high_water && !r->high_water_done;
    if (st == RT_OK && measure) st = rt_exec_arena_mark(x, &r->e);
    if (st == RT_OK) st = rt_train_micro_batches(r, step, local);
    if (st == RT_OK && measure) { /* the micro-batches alone: the update's phase has its own peak */
        int64_t hw = 0;
        st = rt_exec_arena_high(x, &hw, &r->e);
        r->high_water_done = 1;
        if (st == RT_OK)
            fprintf(stdout,
                    "arena high-water: step %lld's micro-batches wrote %lld bytes of the arena; the plan's step peak is %lld\n",
                    (long long)(step + 1), (long long)hw, (long long)p->plan.arena[RT_PHASE_STEP]);
    }
    x->row = 0;
    if (st == RT_OK) st = rt_train_reduce(r, step);
    if (st == RT_OK) st = rt_train_step_loss(r, local, &loss);
    if (st == RT_OK && r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS | RT_PULL_GRADS, &r->e);
        if (st != RT_OK) return st;
        memcpy(r->dump_p, x->params, (size_t)p->param_floats * sizeof *r->dump_p);
        memcpy(r->dump_g, x->grads, (size_t)p->param_floats * sizeof *r->dump_g);
    }
    if (st != RT_OK) return st;
    st = r->zero == 2 ? rt_train_shard_norm(r, &norm) : rt_exec_grad_norm(x, r->partial, &norm, &r->e);
    if (st == RT_OK && t->clip > 0 && t->clip / (norm + RT_CLIP_EPS) < 1)
        st = rt_exec_grad_scale(x, (float)(t->clip / (norm + RT_CLIP_EPS)), &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: the gradient norm", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_NORM);
    RtStep s = rt_exec_step(x, &r->e);
    s.lr = lr, s.t = step + 1, s.step = step, s.seed = r->o.seed;
    if (r->zero) s.lo = r->shard_off[r->rank], s.hi = r->shard_off[r->rank + 1]; /* this rank's shard */
    if (r->offload) st = rt_opt_offload_update(r->offload, x, &s, &r->e);
    else if (x->gpu && p->train.offload_optimizer == 1) st = rt_train_host_update(r, &s);
    else st = rt_exec_call(x, RT_EXEC_UPDATE, &s);
    if (st == RT_OK && r->zero) st = rt_comm_gather_shards(r->comm, x->params, r->shard_off, &r->e); /* the updated shards */
    if (st == RT_OK) st = rt_exec_grad_zero(x, &r->e);
    /* running statistics: from this step's statistics pass (x->stats), the same on every rank */
    if (st == RT_OK) st = rt_exec_running(x, &r->e);
    if (st != RT_OK) return rt_error_context(&r->e, "step %lld: optimizer", (long long)(step + 1));
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_UPDATE);
    if (r->prof) rt_profile_phase(r->prof, RT_PROF_ZERO);
    if (r->dump_x && step == 0) {
        st = rt_exec_pull(x, RT_PULL_PARAMS, &r->e);
        if (st != RT_OK) return st;
        RtStepDump d = {r->dump_p, r->dump_g, x->params, r->dump_x, r->dump_y, nmicro, loss, lr, t->clip, r->o.seed};
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
        st = rt_evaluate(&r->x, r->val, t->eval_steps * (t->global / t->micro), o->seed, r->nranks > 1 ? r->comm : NULL, &vl,
                         &used, &r->e);
        if (st == RT_OK) st = rt_log_eval(&r->log, step + 1, vl, used, &r->e);
    }
    /* several ranks: their agreement (rt_train_gather_losses); alone, a signal up to now */
    if (r->nranks == 1) r->stop_sig = rt_stop_signal, r->stop_rank = 0;
    *stop = r->stop_sig != 0;
    if (st == RT_OK && r->ckpt) st = rt_ckpt_report(p, o, r->ckpt, 0, r->waited, &r->log, &r->e);
    if (st != RT_OK || !(*stop || (o->ckpt_every > 0 && ((step + 1) % o->ckpt_every == 0 || step + 1 == o->steps)))) return st;
    if (r->zero) st = rt_train_gather_state(r); /* every rank takes part */
    if (st != RT_OK || r->rank > 0) return st;  /* rank 0 writes the checkpoint */
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
    if (r->x.gpu) { /* the runtime's own high-water mark of device memory (bench/gpu.py reads it), CUDA graphs */
        char peak[32], graphs[512];
        printf("GPU: peak %s of device allocations (%lld bytes); %s\n", rt_gpu_format_bytes(rt_gpu_peak_bytes(r->x.gpu), peak),
               (long long)rt_gpu_peak_bytes(r->x.gpu), rt_gpu_graph_report(r->x.gpu, graphs, sizeof graphs));
    }
    if (r->x.act_store && done_steps > 0)
        printf("activations: the steps waited %.3f s for the store in all (%.3f ms/step)\n", r->x.act_wait_s,
               r->x.act_wait_s * 1e3 / (double)done_steps);
    if (r->x.gpu) rt_gpu_print_timing(stdout, r->x.gpu); /* MBT_DEBUG / MBT_TRACE: where the GPU's time went */
    if (r->prof) {
        rt_pool_set_profile(r->x.pool, NULL);
        rt_profile_print(stdout, r->prof, rt_pool_threads(r->x.pool));
    }
    if (r->model_gbps > 0 && r->fb_n > 0) rt_train_print_model(r);
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
    free(r->micro_loss);
    free(r->all_loss);
    free(r->shard_off);
    free(r->shard_got);
    free(r->zero_scratch);
    free(r->state_full);
    free(r->norm_all);
    rt_dp_reduce_close(r->buckets);
    free(r->dump_x);
    free(r->stat_x);
    free(r->stat_y);
    free(r->stat_mine);
    free(r->stat_all);
    free(r->dump_y);
    free(r->dump_p);
    free(r->dump_g);
    rt_opt_offload_close(r->offload); /* removes the store file */
    rt_exec_close(&r->x);
    free(r->prof);
    rt_data_close(r->val);
    rt_data_close(r->train);
}

/* The world of ranks (docs/parallel.md): opened before anything else, so that every rank agrees on
 * it before any work. Its size must be the program's parallel.data, or 1 (then the data ranks run
 * in this one process, in turn). Only rank 0 prints the run's lines and writes --log: the others'
 * standard output goes to /dev/null and their errors name their rank. *agreed is set for a failure
 * every rank sees alike (the world's size): rank 0 alone says why, and no rank aborts the others. */
static RtStatus rt_train_world(RtTrainRun *r, char *prog, size_t nprog, int *agreed) {
    double timeout;
    RtStatus st = rt_comm_timeout_env(&timeout, &r->e);
    if (st == RT_OK) st = rt_comm_open(&r->comm, timeout, &r->e);
    if (st != RT_OK) return st;
    int size = rt_comm_size(r->comm), rank = rt_comm_rank(r->comm);
    long long dr = (long long)r->p->train.data_ranks;
    if (rank > 0) {
        snprintf(prog, nprog, "%s (rank %d)", r->o.prog, rank);
        r->o.prog = prog;
        r->o.log_path = NULL; /* rank 0 writes the run's files: the ranks hold the same weights */
        r->o.save_weights = NULL;
        r->o.dump_step = NULL;
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) return rt_fail_errno(&r->e, errno, "rank %d: cannot quiet standard output", rank);
    }
    if (size > 1 && size != dr) {
        *agreed = 1;
        return rt_fail(&r->e, RT_ERR_ARG, "this program trains with parallel.data = %lld rank%s; %s started %d (%s)", dr,
                       dr == 1 ? "" : "s", rt_comm_launcher(r->comm), size,
                       dr == 1 ? "run it alone, without a launcher" : "start as many processes as parallel.data");
    }
    r->rank = rank, r->nranks = size;
    return RT_OK;
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
    case RT_CMD_SERVE: code = rt_cmd_serve(p, &o); break;
    }
    rt_options_free(&o);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write to standard output: %s\n", prog, strerror(errno));
        if (code == 0) code = 1;
    }
    return code;
}
