/* program.c - every executable's entry: rt_main checks the program's descriptor (rt_program_check:
 * the generated object and this runtime agree, and the descriptor is self-consistent), parses the
 * command line (cli.c) and runs the command (train and eval: train.c; generate: generate.c; serve:
 * runtime/serve/server.c; info: info.c).
 *
 * Pipeline position: the top of every executable; runtime/cli/main.c hands rt_main the descriptor
 * (rt_program.h). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_exec.h"

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
