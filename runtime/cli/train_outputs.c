/* train_outputs.c - the train command's outputs checked before anything runs (docs/robustness.md):
 * every file the run will write (--save-weights, --log, --dump-step, the checkpoint directory) must
 * be writable and must not be one of the run's inputs (the program, its data, its weights or the
 * checkpoint it resumes), so that a run never fails at its end or overwrites what it reads. */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train_internal.h"

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
RtStatus rt_train_check_outputs(RtTrainRun *r) {
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
