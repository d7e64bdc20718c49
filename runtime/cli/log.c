/* log.c - training progress: one line redrawn in place on a terminal, plain lines otherwise, and
 * with --log one JSON object per step in a file (see rt_exec.h; docs/runtime.md, "Logs").
 *
 * Pipeline position: called by the train loop after every optimizer step and evaluation. The
 * terminal line is redrawn at most every RT_LOG_REDRAW seconds (and at the last step), so a
 * fast run does not spend its time repainting; plain lines (a pipe, a file, CI) get every step.
 * The JSONL file is flushed after every line, so it can be followed while the run goes on and a
 * killed run leaves only whole lines. */
#include <errno.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_exec.h"

#define RT_LOG_REDRAW 0.1 /* seconds between redraws of the terminal line */

/* "1h02m03s", "2m03s", "12s" */
static void rt_fmt_duration(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, n, "?");
        return;
    }
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%lldh%02lldm%02llds", t / 3600, t / 60 % 60, t % 60);
    else if (t >= 60) snprintf(buf, n, "%lldm%02llds", t / 60, t % 60);
    else snprintf(buf, n, "%llds", t);
}

/* 1234567 -> "1.23M" */
static void rt_fmt_count(char *buf, size_t n, double v) {
    if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(buf, n, "%.1fk", v / 1e3);
    else snprintf(buf, n, "%.0f", v);
}

/* One line of the JSONL file: the object (consumed) as one line, numbers to 9 significant
 * digits, flushed. */
static RtStatus rt_log_put(RtLog *l, json_t *obj, RtError *err) {
    char *text = rt_json_text(obj, JSON_REAL_PRECISION(9), NULL);
    json_decref(obj);
    if (!text) return rt_fail_errno(err, ENOMEM, "cannot write the log file '%s'", l->jsonl_path);
    errno = 0;
    int rc = fprintf(l->jsonl, "%s\n", text);
    free(text);
    if (rc < 0 || fflush(l->jsonl) != 0)
        return rt_fail_errno(err, errno ? errno : EIO, "cannot write the log file '%s'", l->jsonl_path);
    return RT_OK;
}

/* A resumed run's log: the file's lines for steps after `step` - logged by a run that was killed
 * after them, and about to be done again by this one - and a last line cut short by the kill are
 * dropped, so the file holds each step once, as one history. The rest is rewritten in place
 * through a temporary file renamed over it. A missing file is fine (nothing to keep). */
static RtStatus rt_log_trim(const char *path, int64_t step, RtError *err) {
    FILE *in = fopen(path, "r");
    if (!in) return errno == ENOENT ? RT_OK : rt_fail_errno(err, errno, "cannot open the log file '%s'", path);
    size_t plen = strlen(path) + 16;
    char *tmp = malloc(plen);
    if (!tmp) {
        fclose(in);
        return rt_fail_errno(err, ENOMEM, "cannot open the log file '%s'", path);
    }
    snprintf(tmp, plen, "%s.tmp-%ld", path, (long)getpid());
    FILE *out = fopen(tmp, "w");
    RtStatus st = out ? RT_OK : rt_fail_errno(err, errno, "cannot rewrite the log file '%s' (through '%s')", path, tmp);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (st == RT_OK && (n = getline(&line, &cap, in)) > 0) {
        if (line[n - 1] != '\n') break; /* cut short */
        if (strncmp(line, "{\"step\": ", 9) == 0 && strtoll(line + 9, NULL, 10) > step) continue;
        if (fwrite(line, 1, (size_t)n, out) != (size_t)n)
            st = rt_fail_errno(err, errno, "cannot rewrite the log file '%s'", path);
    }
    if (st == RT_OK && ferror(in)) st = rt_fail_errno(err, errno ? errno : EIO, "cannot read the log file '%s'", path);
    free(line);
    fclose(in);
    if (out && fclose(out) != 0 && st == RT_OK) st = rt_fail_errno(err, errno, "cannot rewrite the log file '%s'", path);
    if (st == RT_OK && rename(tmp, path) != 0) st = rt_fail_errno(err, errno, "cannot rewrite the log file '%s'", path);
    if (st != RT_OK && out) remove(tmp);
    free(tmp);
    return st;
}

RtStatus rt_log_open(RtLog *l, FILE *out, int tty, const char *jsonl_path, int64_t resumed_step, int64_t total_steps,
                     RtError *err) {
    memset(l, 0, sizeof *l);
    l->out = out;
    l->tty = tty;
    l->total_steps = total_steps;
    l->t_start = rt_now();
    l->last_draw = -1e30;
    if (jsonl_path) {
        /* A pipe or a device (--log /dev/stdout, a FIFO a reader follows) is a stream: nothing
         * to trim on a resume. A FIFO nobody reads would block open() for good: opened without
         * blocking, that is ENXIO, reported. */
        struct stat sb;
        int regular = stat(jsonl_path, &sb) != 0 || S_ISREG(sb.st_mode);
        if (resumed_step >= 0 && regular) {
            RtStatus st = rt_log_trim(jsonl_path, resumed_step, err);
            if (st != RT_OK) return st;
        }
        int fd = open(jsonl_path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (resumed_step >= 0 ? O_APPEND : O_TRUNC), 0644);
        if (fd < 0 && errno == ENXIO)
            return rt_fail(err, RT_ERR_IO, "cannot open the log file '%s': it is a FIFO (named pipe) that no process reads",
                           jsonl_path);
        int fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
        if (fd >= 0 && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)) {
            close(fd);
            fd = -1;
        }
        l->jsonl = fd >= 0 ? fdopen(fd, resumed_step >= 0 ? "a" : "w") : NULL;
        if (!l->jsonl) {
            int e = errno;
            if (fd >= 0) close(fd);
            return rt_fail_errno(err, e, "cannot open the log file '%s'", jsonl_path);
        }
        l->jsonl_path = jsonl_path;
    }
    return RT_OK;
}

RtStatus rt_log_step(RtLog *l, const RtStepLog *s, RtError *err) {
    double tok_s = s->ms > 0 ? (double)s->tokens / (s->ms * 1e-3) : 0;
    if (s->step > 1) { /* the first step warms caches and pages in the data: not in the ETA */
        l->timed_ms += s->ms;
        l->timed_steps++;
    }
    double per = l->timed_steps ? l->timed_ms / (double)l->timed_steps : s->ms;
    double eta = per * 1e-3 * (double)(l->total_steps - s->step);
    char etab[32], tokb[32];
    rt_fmt_duration(etab, sizeof etab, eta);
    rt_fmt_count(tokb, sizeof tokb, tok_s);
    if (l->out && l->tty) {
        double now = rt_now();
        if (now - l->last_draw >= RT_LOG_REDRAW || s->step == l->total_steps) {
            fprintf(l->out, "\rstep %lld/%lld | loss %.4f | lr %.3e | %s tok/s | %.1f ms/step | ETA %s\033[K", (long long)s->step,
                    (long long)l->total_steps, s->loss, s->lr, tokb, s->ms, etab);
            fflush(l->out);
            l->last_draw = now;
            l->line_open = 1;
        }
    } else if (l->out) {
        fprintf(l->out, "step %lld/%lld: loss %.6f, lr %.4e, grad norm %.4g, %.0f tokens/s, %.2f ms, ETA %s\n",
                (long long)s->step, (long long)l->total_steps, s->loss, s->lr, s->grad_norm, tok_s, s->ms, etab);
    }
    if (l->jsonl)
        return rt_log_put(l,
                          json_pack("{s:I, s:o, s:o, s:o, s:o, s:I, s:o}", "step", (json_int_t)s->step, "loss",
                                    rt_json_new_f64(s->loss), "lr", rt_json_new_f64(s->lr), "grad_norm",
                                    rt_json_new_f64(s->grad_norm), "ms", rt_json_new_f64(s->ms), "tokens", (json_int_t)s->tokens,
                                    "tokens_per_s", rt_json_new_f64(tok_s)),
                          err);
    return RT_OK;
}

/* Ends a terminal line that is showing, so a message can follow on its own line. */
static void rt_log_break(RtLog *l) {
    if (l->out && l->line_open) fputc('\n', l->out);
    l->line_open = 0;
}

RtStatus rt_log_eval(RtLog *l, int64_t step, double loss, int64_t batches, RtError *err) {
    if (l->out) {
        rt_log_break(l);
        fprintf(l->out, "step %lld/%lld: val loss %.6f (%lld batches)\n", (long long)step, (long long)l->total_steps, loss,
                (long long)batches);
        fflush(l->out);
    }
    if (l->jsonl)
        return rt_log_put(l,
                          json_pack("{s:I, s:o, s:I}", "step", (json_int_t)step, "val_loss", rt_json_new_f64(loss), "val_batches",
                                    (json_int_t)batches),
                          err);
    return RT_OK;
}

RtStatus rt_log_checkpoint(RtLog *l, const RtCkptDone *d, double waited_s, RtError *err) {
    if (l->out) {
        rt_log_break(l);
        if (d->status == RT_OK)
            fprintf(l->out, "checkpoint: step %lld written to '%s' (%.1f MB in %.2f s, %.0f MB/s; training waited %.1f ms)\n",
                    (long long)d->step, d->path, (double)d->bytes / 1e6, d->write_s,
                    d->write_s > 0 ? (double)d->bytes / 1e6 / d->write_s : 0.0, waited_s * 1e3);
        fflush(l->out);
    }
    if (l->jsonl && d->status == RT_OK) {
        char name[40];
        snprintf(name, sizeof name, "step-%08lld", (long long)d->step);
        return rt_log_put(l,
                          json_pack("{s:I, s:s, s:I, s:o, s:o}", "step", (json_int_t)d->step, "checkpoint", name, "bytes",
                                    (json_int_t)d->bytes, "write_s", rt_json_new_f64(d->write_s), "waited_s",
                                    rt_json_new_f64(waited_s)),
                          err);
    }
    return RT_OK;
}

RtStatus rt_log_close(RtLog *l, RtError *err) {
    if (l->out && l->line_open) {
        fputc('\n', l->out);
        fflush(l->out);
    }
    l->line_open = 0;
    RtStatus st = RT_OK;
    if (l->jsonl) {
        if (fclose(l->jsonl) != 0) st = rt_fail_errno(err, errno, "cannot close the log file '%s'", l->jsonl_path);
        l->jsonl = NULL;
    }
    return st;
}
