/* checkpoint.c - checkpoints: written asynchronously and atomically, resumed bit-exactly (see
 * rt_exec.h; docs/runtime.md, "Checkpoints").
 *
 * Pipeline position: the train loop (train.c) calls rt_ckpt_save at a step boundary every
 * `checkpoint { every }` steps, at the end, and when SIGTERM or SIGINT asks the run to stop;
 * `--resume` calls rt_ckpt_resolve and rt_ckpt_load before the first step.
 *
 * Writing. rt_ckpt_save copies the parameter and optimizer-state regions into a snapshot (the
 * only time training waits, besides waiting for the previous write) and a background thread
 * writes DIR/step-N.tmp.<pid>/: model.safetensors, optimizer.safetensors, then state.json with
 * the files' checksums and its own (every byte of a checkpoint is checksummed); each file is written to a temporary name, fsynced and renamed
 * (rt_st_write, rt_atomic_*), the directory is fsynced, renamed to DIR/step-N, and DIR fsynced.
 * Only then is DIR/latest replaced (atomically) and are checkpoints beyond `keep` removed. A
 * failure at any point removes the temporary directory and leaves every earlier checkpoint and
 * `latest` as they were; a kill at any point leaves at most a `*.tmp.<pid>` directory, which the
 * next writer of DIR removes. One run writes a directory at a time (flock on DIR/.lock).
 *
 * Resuming. Every random draw of a run is a pure function of the seed and counters (docs/runtime.md,
 * "Random numbers"), so the seed, the step and the data position are the whole random state:
 * with the parameters and the optimizer state restored exactly (F32), the steps after a resume
 * compute exactly what an uninterrupted run computes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_exec.h"

#define RT_CKPT_FORMAT "mbt-checkpoint"
#define RT_CKPT_VERSION 2 /* 2: state.json carries its own checksum (RT_CKPT_SELF) */
#define RT_CKPT_MODEL "model.safetensors"
#define RT_CKPT_OPTIM "optimizer.safetensors"
#define RT_CKPT_STATE "state.json"
/* DIR/latest: the newest checkpoint's name on its first line, and on its second the XXH3-128 of
 * that checkpoint's state.json (which covers every other byte of it), so that a pointer damaged
 * into naming another checkpoint, or damaged at all, is refused rather than followed. */
#define RT_CKPT_LATEST_SUM "state.json xxh3-128 "
#define RT_CKPT_LATEST_MAX 128
#define RT_CKPT_STATE_MAX ((int64_t)64 << 20) /* state.json is a few KB: a larger one is not ours */
/* state.json's last key: the XXH3-128 of state.json's bytes with this value's 32 digits read as
 * zeros, so that every byte of a checkpoint is under a checksum (the two region files under theirs,
 * which state.json records) */
#define RT_CKPT_SELF "\"state_xxh3_128\": \""
#define RT_CKPT_SELF_ZERO "00000000000000000000000000000000"

struct RtCkptWriter {
    const RtProgram *p;
    char *dir;
    int64_t keep;
    int async;
    int lock_fd;
    float *snap_params, *snap_state; /* the snapshot the writer reads (allocated at the first save) */
    RtCkptInfo info;                 /* the snapshot's step */
    double started;                  /* when the snapshot began */
    int64_t nwritten;                /* checkpoints begun by this writer (the fault-injection hook counts them) */
    pthread_t thread;
    int busy;            /* a thread is running or not yet joined */
    atomic_int finished; /* set by the thread as it ends */
    RtCkptDone done;     /* the thread's result (the thread's while busy) */
    RtCkptDone report;   /* a joined result not yet returned by rt_ckpt_poll */
    int has_report;
    json_t *data_files; /* the training files, state.json's "data" "files" array */
};

/* ---- paths and directories --------------------------------------------------------------------- */

static char *rt_path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", a, b);
    return s;
}

static int rt_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes a directory tree (a leftover or an old checkpoint); 0 or -1 with errno. */
static int rt_rm_tree(const char *path) { return nftw(path, rt_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* "step-00000100" -> 100; -1 for any other name. */
static int64_t rt_ckpt_step_of(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = strlen(d);
    if (n < 8 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        v = v * 10 + (d[i] - '0');
    }
    return v;
}

/* mkdir -p */
static RtStatus rt_mkdirs(const char *dir, RtError *err) {
    char *s = strdup(dir);
    if (!s) return rt_fail_errno(err, ENOMEM, "cannot create the checkpoint directory '%s'", dir);
    for (char *c = s + 1;; c++) {
        if (*c != '/' && *c) continue;
        char keep = *c;
        *c = 0;
        if (mkdir(s, 0755) != 0 && errno != EEXIST) {
            RtStatus st = rt_fail_errno(err, errno, "cannot create the checkpoint directory '%s'", s);
            free(s);
            return st;
        }
        *c = keep;
        if (!keep) break;
    }
    free(s);
    struct stat sb;
    if (stat(dir, &sb) != 0) return rt_fail_errno(err, errno, "cannot use the checkpoint directory '%s'", dir);
    if (!S_ISDIR(sb.st_mode)) return rt_fail(err, RT_ERR_IO, "the checkpoint directory '%s' is not a directory", dir);
    return RT_OK;
}

/* ---- state.json -------------------------------------------------------------------------------- */

typedef struct RtCkptFile {
    const char *name;
    int64_t bytes;
    char sum[RT_CHECKSUM_CHARS];
} RtCkptFile;

/* The text of state.json (malloc'd, ending in a newline), or NULL when out of memory. */
static char *rt_ckpt_state_json(const RtProgram *p, const RtCkptInfo *in, json_t *data_files, const RtCkptFile *files, int nfiles,
                                size_t *len) {
    const RtTrainSettings *t = &p->train;
    json_t *state = json_array(), *sums = json_object();
    for (int64_t k = 0; state && k < p->nstate; k++) json_array_append_new(state, json_string(p->state_names[k]));
    for (int i = 0; sums && i < nfiles; i++)
        json_object_set_new(sums, files[i].name,
                            json_pack("{s:I, s:s}", "bytes", (json_int_t)files[i].bytes, "xxh3_128", files[i].sum));
    char fingerprint[17];
    snprintf(fingerprint, sizeof fingerprint, "%016" PRIx64, in->data.fingerprint);
    /* every draw is Philox4x32-10 keyed by the seed and counted by (step, micro-batch, element):
     * there is no generator state beyond the seed and the step */
    json_t *doc =
        json_pack("{s:s, s:i, s:I, s:{s:s, s:s, s:s}, s:{s:s, s:I, s:i, s:i, s:I, s:I, s:I, s:I}, s:{s:o}, s:{s:s, s:o, s:I},"
                  " s:{s:o, s:o, s:o, s:s, s:O}, s:{s:I, s:I, s:I, s:o, s:o}, s:o}",
                  "format", RT_CKPT_FORMAT, "version", RT_CKPT_VERSION, "step", (json_int_t)in->step, "program", "source",
                  p->source ? p->source : "", "train", t->name, "hash", p->hash ? p->hash : "", "layout", "device",
                  in->device ? in->device : "cpu", "data_ranks", (json_int_t)t->data_ranks, "tensor", 1, "pipeline", 1, "micro",
                  (json_int_t)t->micro, "seq", (json_int_t)t->seq, "global", (json_int_t)t->global, "accum", (json_int_t)t->accum,
                  "optimizer", "state", state, "rng", "generator", "philox4x32-10", "seed", rt_json_new_u64(in->seed),
                  "counter_step", (json_int_t)in->step, "data", "epoch", rt_json_new_u64(in->data.epoch), "shard",
                  rt_json_new_u64(in->data.shard), "window", rt_json_new_u64(in->data.window), "fingerprint", fingerprint,
                  "files", data_files, "schedule", "next_step", (json_int_t)in->step, "global", (json_int_t)in->global, "accum",
                  (json_int_t)in->accum, "lr", rt_json_new_f64(in->lr), "loss", rt_json_new_f64(in->loss), "files", sums);
    if (doc) json_object_set_new(doc, "state_xxh3_128", json_string(RT_CKPT_SELF_ZERO));
    char *text = rt_json_text(doc, JSON_INDENT(2), len);
    json_decref(doc);
    char *line = text ? realloc(text, *len + 2) : NULL;
    if (!line) {
        free(text);
        return NULL;
    }
    line[(*len)++] = '\n';
    line[*len] = 0;
    char *self = strstr(line, RT_CKPT_SELF RT_CKPT_SELF_ZERO "\"");
    if (!self) {
        free(line);
        return NULL;
    }
    char sum[RT_CHECKSUM_CHARS];
    rt_checksum(line, *len, sum);
    memcpy(self + strlen(RT_CKPT_SELF), sum, RT_CHECKSUM_CHARS - 1);
    return line;
}

/* A file read whole (rt_read_file). */
typedef struct RtText {
    unsigned char *data;
    size_t size;
} RtText;

/* state.json's own checksum (RT_CKPT_SELF): present once, and equal to that of its bytes with
 * the checksum's digits read as zeros. */
static RtStatus rt_ckpt_check_self(const char *spath, const json_t *root, const RtText *m, RtError *err) {
    const char *text = (const char *)m->data, *want = rt_json_str(rt_json_get(root, "state_xxh3_128"));
    size_t klen = strlen(RT_CKPT_SELF), dlen = RT_CHECKSUM_CHARS - 1;
    const char *at = memmem(text, m->size, RT_CKPT_SELF, klen);
    if (!want || !at)
        return rt_fail(err, RT_ERR_FORMAT,
                       "checkpoint state '%s' has no checksum of itself (state_xxh3_128): it was not "
                       "written by this runtime, or was changed",
                       spath);
    size_t off = (size_t)(at - text) + klen;
    if (off + dlen > m->size || strlen(want) != dlen || memcmp(text + off, want, dlen) != 0 ||
        memmem(at + 1, m->size - (size_t)(at + 1 - text), RT_CKPT_SELF, klen))
        return rt_fail(err, RT_ERR_FORMAT, "checkpoint state '%s': its checksum (state_xxh3_128) is malformed or given twice",
                       spath);
    char *copy = malloc(m->size);
    if (!copy) return rt_fail_errno(err, ENOMEM, "cannot check checkpoint state '%s'", spath);
    memcpy(copy, text, m->size);
    memcpy(copy + off, RT_CKPT_SELF_ZERO, dlen);
    char sum[RT_CHECKSUM_CHARS];
    rt_checksum(copy, m->size, sum);
    free(copy);
    if (strcmp(sum, want) != 0)
        return rt_fail(err, RT_ERR_FORMAT,
                       "checkpoint state '%s' fails its checksum (xxh3-128 %s, it says %s): it was changed or damaged; "
                       "resume from another checkpoint",
                       spath, sum, want);
    return RT_OK;
}

/* ---- writing ----------------------------------------------------------------------------------- */

static RtStatus rt_ckpt_write_regions(const RtCkptWriter *w, const char *tmp, RtCkptFile files[2], RtError *err) {
    const RtProgram *p = w->p;
    int64_t np = p->nparams, ns = p->nstate;
    RtStEntry *e = calloc((size_t)(np * (ns > 1 ? ns : 1)) + 1, sizeof *e);
    char **names = calloc((size_t)(np * ns) + 1, sizeof *names);
    char *model = rt_path_join(tmp, RT_CKPT_MODEL), *optim = rt_path_join(tmp, RT_CKPT_OPTIM);
    RtStatus st = e && names && model && optim ? RT_OK : rt_fail_errno(err, ENOMEM, "cannot list the tensors to write");
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, w->info.step);
    RtStMeta meta[2] = {{"format", "pt"}, {"mbt.step", step}};
    if (st == RT_OK) {
        for (int64_t i = 0; i < np; i++) {
            const RtParam *q = &p->params[i];
            e[i] = (RtStEntry){q->name, RT_F32, q->rank, q->shape, w->snap_params + q->offset, 0};
        }
        st = rt_st_write(model, e, np, meta, 2, err);
    }
    /* a test can stop the process here, with the model written and the rest not (docs/runtime.md) */
    const char *kill_at = getenv("MBT_TEST_KILL_IN_CHECKPOINT");
    if (st == RT_OK && kill_at && atoll(kill_at) == w->nwritten) raise(SIGKILL);
    int64_t part = rt_state_part(p), ne = 0;
    for (int64_t k = 0; st == RT_OK && k < ns; k++)
        for (int64_t i = 0; i < np; i++) {
            const RtParam *q = &p->params[i];
            if (!rt_has_state(p, q)) continue; /* frozen: no optimizer state */
            size_t len = strlen(q->name) + strlen(p->state_names[k]) + 2;
            char *nm = names[ne] = malloc(len);
            if (!nm) {
                st = rt_fail_errno(err, ENOMEM, "cannot list the tensors to write");
                break;
            }
            snprintf(nm, len, "%s.%s", q->name, p->state_names[k]);
            e[ne++] = (RtStEntry){nm, RT_F32, q->rank, q->shape, w->snap_state + k * part + q->offset, 0};
        }
    if (st == RT_OK) st = rt_st_write(optim, e, ne, meta, 2, err);
    files[0].name = RT_CKPT_MODEL, files[1].name = RT_CKPT_OPTIM;
    if (st == RT_OK) st = rt_checksum_file(model, "checkpoint file", files[0].sum, &files[0].bytes, err);
    if (st == RT_OK) st = rt_checksum_file(optim, "checkpoint file", files[1].sum, &files[1].bytes, err);
    for (int64_t i = 0; names && i < np * ns; i++) free(names[i]);
    free(names);
    free(e);
    free(model);
    free(optim);
    return st;
}

/* Removes the checkpoints of DIR older than the newest `keep` (never `newest` itself). */
static RtStatus rt_ckpt_prune(const char *dir, int64_t keep, int64_t newest, RtError *err) {
    if (keep <= 0) return RT_OK;
    DIR *d = opendir(dir);
    if (!d) return rt_fail_errno(err, errno, "cannot list the checkpoint directory '%s'", dir);
    int64_t *steps = NULL, n = 0, cap = 0;
    RtStatus st = RT_OK;
    for (struct dirent *de; (de = readdir(d));) {
        int64_t s = rt_ckpt_step_of(de->d_name);
        if (s < 0 || s == newest) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *ns = realloc(steps, (size_t)cap * sizeof *ns);
            if (!ns) {
                st = rt_fail_errno(err, ENOMEM, "cannot list the checkpoint directory '%s'", dir);
                break;
            }
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    /* the newest keep - 1 others stay: remove the rest, oldest first */
    for (int64_t i = 0; st == RT_OK && i < n; i++) {
        int64_t newer = 0;
        for (int64_t j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (steps[i] > newest || newer < keep - 1) continue;
        char name[40], *path;
        snprintf(name, sizeof name, "step-%08" PRId64, steps[i]);
        path = rt_path_join(dir, name);
        if (!path || rt_rm_tree(path) != 0)
            st = rt_fail_errno(err, path ? errno : ENOMEM, "cannot remove the old checkpoint '%s' (keep = %" PRId64 ")",
                               path ? path : name, keep);
        free(path);
    }
    free(steps);
    return st;
}

/* Writes the snapshot as DIR/step-N, then DIR/latest, then prunes. */
static RtStatus rt_ckpt_write(RtCkptWriter *w, RtCkptDone *d, RtError *err) {
    char name[40], tmpname[80], oldname[80];
    snprintf(name, sizeof name, "step-%08" PRId64, w->info.step);
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", name, (long)getpid());
    snprintf(oldname, sizeof oldname, "%s.old.%ld", name, (long)getpid());
    char *final = rt_path_join(w->dir, name), *tmp = rt_path_join(w->dir, tmpname), *old = rt_path_join(w->dir, oldname);
    char *state = tmp ? rt_path_join(tmp, RT_CKPT_STATE) : NULL, *latest = rt_path_join(w->dir, "latest");
    RtStatus st = final && tmp && old && state && latest ? RT_OK : rt_fail_errno(err, ENOMEM, "cannot write a checkpoint");
    if (st == RT_OK) snprintf(d->path, sizeof d->path, "%s", final);
    int made = 0, renamed = 0;
    if (st == RT_OK) {
        rt_rm_tree(tmp); /* a leftover of this pid: there is none unless pids were reused */
        if (mkdir(tmp, 0755) != 0) st = rt_fail_errno(err, errno, "cannot create '%s'", tmp);
        else made = 1;
    }
    RtCkptFile files[2];
    memset(files, 0, sizeof files);
    if (st == RT_OK) st = rt_ckpt_write_regions(w, tmp, files, err);
    char state_sum[RT_CHECKSUM_CHARS] = "";
    if (st == RT_OK) {
        size_t len = 0;
        char *json = rt_ckpt_state_json(w->p, &w->info, w->data_files, files, 2, &len);
        if (!json) st = rt_fail_errno(err, ENOMEM, "cannot write '%s'", state);
        else st = rt_atomic_write_file(state, "checkpoint state", json, len, err); /* also fsyncs tmp */
        if (json) rt_checksum(json, len, state_sum);
        free(json);
        d->bytes = files[0].bytes + files[1].bytes + (int64_t)len;
    }
    /* the commit point: the complete directory takes its final name (an older one of the same
     * step, from a run resumed before it, is moved aside first and removed after) */
    struct stat sb;
    int had_old = 0;
    if (st == RT_OK && lstat(final, &sb) == 0) {
        rt_rm_tree(old);
        if (rename(final, old) != 0) st = rt_fail_errno(err, errno, "cannot move the earlier '%s' aside", final);
        else had_old = 1;
    }
    if (st == RT_OK) {
        if (rename(tmp, final) != 0) st = rt_fail_errno(err, errno, "cannot rename '%s' to '%s'", tmp, final);
        else renamed = 1;
    }
    if (st == RT_OK) st = rt_fsync_dir(w->dir, err);
    if (had_old) rt_rm_tree(old);
    if (st == RT_OK) {
        char text[RT_CKPT_LATEST_MAX];
        int n = snprintf(text, sizeof text, "%s\n" RT_CKPT_LATEST_SUM "%s\n", name, state_sum);
        st = rt_atomic_write_file(latest, "checkpoint pointer", text, (size_t)n, err);
    }
    if (st == RT_OK) st = rt_ckpt_prune(w->dir, w->keep, w->info.step, err);
    if (made && !renamed) rt_rm_tree(tmp);
    free(final);
    free(tmp);
    free(old);
    free(state);
    free(latest);
    return st;
}

static void *rt_ckpt_thread(void *arg) {
    RtCkptWriter *w = arg;
    RtCkptDone *d = &w->done;
    rt_error_clear(&d->err);
    d->status = rt_ckpt_write(w, d, &d->err);
    d->write_s = rt_now() - w->started;
    atomic_store(&w->finished, 1);
    return NULL;
}

/* Joins the thread under way; its result becomes the report. */
static void rt_ckpt_join(RtCkptWriter *w) {
    if (!w->busy) return;
    pthread_join(w->thread, NULL);
    w->busy = 0;
    w->report = w->done;
    w->has_report = 1;
}

/* The snapshot's memory, allocated and touched once (memset faults its pages in), so that the
 * first checkpoint's copy does not pay for a fresh mapping of the whole state. */
static RtStatus rt_ckpt_snapshot_alloc(RtCkptWriter *w, RtError *err) {
    if (w->snap_params) return RT_OK;
    const RtProgram *p = w->p;
    size_t pb = ((size_t)p->param_floats * 4 + RT_ALIGN) / RT_ALIGN * RT_ALIGN;
    size_t sb = ((size_t)p->state_floats * 4 + RT_ALIGN) / RT_ALIGN * RT_ALIGN;
    if (posix_memalign((void **)&w->snap_params, RT_ALIGN, pb) != 0) w->snap_params = NULL;
    if (posix_memalign((void **)&w->snap_state, RT_ALIGN, sb) != 0) w->snap_state = NULL;
    if (!w->snap_params || !w->snap_state) {
        free(w->snap_params);
        free(w->snap_state);
        w->snap_params = w->snap_state = NULL;
        return rt_fail_errno(err, ENOMEM, "cannot hold a checkpoint's snapshot (%lld bytes)",
                             (long long)(p->param_floats + p->state_floats) * 4);
    }
    memset(w->snap_params, 0, pb);
    memset(w->snap_state, 0, sb);
    return RT_OK;
}

/* The training files as a JSON array: each one's path, size and sampled checksum. */
static RtStatus rt_ckpt_data_files(const RtData *train, json_t **out, RtError *err) {
    json_t *a = *out = json_array();
    RtStatus st = a ? RT_OK : rt_fail_errno(err, ENOMEM, "cannot describe the training data");
    for (int64_t i = 0; st == RT_OK && i < rt_data_nfiles(train); i++) {
        char sum[RT_CHECKSUM_CHARS];
        int64_t bytes = 0;
        st = rt_checksum_sample(rt_data_file(train, i), "data shard", sum, &bytes, err);
        if (st == RT_OK && json_array_append_new(a, json_pack("{s:s, s:I, s:s}", "path", rt_data_file(train, i), "bytes",
                                                              (json_int_t)bytes, "sample_xxh3_128", sum)) != 0)
            st = rt_fail_errno(err, ENOMEM, "cannot describe the training data");
    }
    return st;
}

/* Takes DIR/.lock (flock, held until the descriptor is closed) and writes this process's id into
 * it, so that another run's refusal can name the holder. */
static RtStatus rt_ckpt_lock(const char *dir, int *fd_out, RtError *err) {
    char *lock = rt_path_join(dir, ".lock");
    if (!lock) return rt_fail_errno(err, ENOMEM, "cannot lock the checkpoint directory '%s'", dir);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fd = open(lock, O_RDONLY | O_CLOEXEC); /* a read-only directory can still be locked */
    RtStatus st = RT_OK;
    if (fd < 0) st = rt_fail_errno(err, errno, "cannot create the lock file '%s'", lock);
    else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            char pid[24] = "";
            ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
            pid[n > 0 ? n : 0] = 0;
            pid[strspn(pid, "0123456789")] = 0;
            st = rt_fail(err, RT_ERR_ARG,
                         "another run is writing checkpoints to '%s' (it holds '%s'%s%s); give another --ckpt-dir", dir, lock,
                         *pid ? ", process " : "", pid);
        } else {
            st = rt_fail_errno(err, errno, "cannot lock '%s'", lock);
        }
    } else {
        char pid[24];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)n, 0) != n) { /* the pid is a courtesy: no error */
        }
    }
    free(lock);
    if (st != RT_OK && fd >= 0) close(fd);
    *fd_out = st == RT_OK ? fd : -1;
    return st;
}

RtStatus rt_ckpt_dir_claim(const char *dir, int required, int *lock_fd, RtError *err) {
    *lock_fd = -1;
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return rt_fail(err, RT_ERR_ARG,
                           "the checkpoint directory '%s' is a file, not a directory (--ckpt-dir names a directory "
                           "that holds the checkpoints)",
                           dir);
        RtStatus st = rt_ckpt_lock(dir, lock_fd, err);
        if (st != RT_OK && st != RT_ERR_ARG && !required) { /* cannot lock, not held: checkpoints were not asked for */
            rt_error_clear(err);
            return RT_OK;
        }
        return st;
    }
    if (errno != ENOENT) return rt_fail_errno(err, errno, "cannot use the checkpoint directory '%s'", dir);
    /* to be created at the first checkpoint: its nearest existing ancestor must be a writable directory */
    char *anc = strdup(dir);
    if (!anc) return rt_fail_errno(err, ENOMEM, "cannot use the checkpoint directory '%s'", dir);
    RtStatus st = RT_OK;
    for (;;) {
        char *slash = strrchr(anc, '/');
        while (slash && slash > anc && slash[1] == 0) *slash = 0, slash = strrchr(anc, '/'); /* trailing slashes */
        if (!slash) snprintf(anc, strlen(anc) + 1, ".");
        else if (slash == anc) anc[1] = 0;
        else *slash = 0;
        if (stat(anc, &sb) == 0) break;
        if (errno != ENOENT || strcmp(anc, ".") == 0 || strcmp(anc, "/") == 0) {
            sb.st_mode = 0;
            break;
        }
    }
    if (required && (!S_ISDIR(sb.st_mode) || access(anc, W_OK | X_OK) != 0))
        st = rt_fail(err, RT_ERR_ARG, "cannot create the checkpoint directory '%s': '%s' is %s", dir, anc,
                     S_ISDIR(sb.st_mode) ? "not writable" : "not a directory");
    free(anc);
    return st;
}

RtStatus rt_ckpt_writer_open(RtCkptWriter **out, const RtProgram *p, const char *dir, int64_t keep, int async,
                             const RtData *train, int lock_fd, RtError *err) {
    *out = NULL;
    RtStatus st = rt_mkdirs(dir, err);
    RtCkptWriter *w = st == RT_OK ? calloc(1, sizeof *w) : NULL;
    if (st != RT_OK || !w || !(w->dir = strdup(dir))) {
        free(w);
        if (lock_fd >= 0) close(lock_fd);
        return st != RT_OK ? st : rt_fail_errno(err, ENOMEM, "cannot set up checkpoints");
    }
    w->p = p, w->keep = keep, w->async = async, w->lock_fd = lock_fd;
    st = rt_ckpt_data_files(train, &w->data_files, err);
    if (st == RT_OK) st = rt_ckpt_snapshot_alloc(w, err);
    if (st != RT_OK) {
        rt_ckpt_writer_close(w);
        return st;
    }
    if (w->lock_fd < 0) st = rt_ckpt_lock(dir, &w->lock_fd, err); /* not claimed at the start of the run */
    /* with the lock held, every temporary directory in DIR is a leftover of a run that died */
    DIR *d = st == RT_OK ? opendir(dir) : NULL;
    if (st == RT_OK && !d) st = rt_fail_errno(err, errno, "cannot list the checkpoint directory '%s'", dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (strncmp(de->d_name, "step-", 5) != 0 || (!strstr(de->d_name, ".tmp.") && !strstr(de->d_name, ".old."))) continue;
        char *path = rt_path_join(dir, de->d_name);
        if (path) rt_rm_tree(path);
        free(path);
    }
    if (d) closedir(d);
    if (st != RT_OK) {
        rt_ckpt_writer_close(w);
        return st;
    }
    *out = w;
    return RT_OK;
}

typedef struct RtCopyJob {
    float *dst;
    const float *src;
    int64_t n;
} RtCopyJob;

#define RT_COPY_BLOCK (1 << 18) /* floats a parallel copy hands each chunk, at least */

static void rt_copy_blocks(void *ctx, int64_t begin, int64_t end, int worker) {
    (void)worker;
    const RtCopyJob *j = ctx;
    int64_t b = begin * RT_COPY_BLOCK, e = end * RT_COPY_BLOCK < j->n ? end * RT_COPY_BLOCK : j->n;
    memcpy(j->dst + b, j->src + b, (size_t)(e - b) * sizeof *j->dst);
}

static void rt_parallel_copy(RtPool *pool, float *dst, const float *src, int64_t n) {
    RtCopyJob j = {dst, src, n};
    rt_parallel_for(pool, (n + RT_COPY_BLOCK - 1) / RT_COPY_BLOCK, rt_copy_blocks, &j);
}

RtStatus rt_ckpt_save(RtCkptWriter *w, RtPool *pool, const float *params, const float *state, const RtCkptInfo *info,
                      double *waited_s, RtError *err) {
    double t0 = rt_now();
    rt_ckpt_join(w);
    const RtProgram *p = w->p;
    RtStatus st = rt_ckpt_snapshot_alloc(w, err);
    if (st != RT_OK) return st;
    w->started = t0;
    rt_parallel_copy(pool, w->snap_params, params, p->param_floats);
    rt_parallel_copy(pool, w->snap_state, state, p->state_floats);
    w->info = *info;
    w->nwritten++;
    memset(&w->done, 0, sizeof w->done);
    w->done.step = info->step;
    atomic_store(&w->finished, 0);
    if (w->async && pthread_create(&w->thread, NULL, rt_ckpt_thread, w) == 0) {
        w->busy = 1;
    } else { /* synchronous (or no thread could be started): write it now */
        rt_ckpt_thread(w);
        w->report = w->done;
        w->has_report = 1;
    }
    *waited_s = rt_now() - t0;
    return RT_OK;
}

int rt_ckpt_poll(RtCkptWriter *w, int wait, RtCkptDone *d) {
    if (!w) return 0;
    /* a result joined by rt_ckpt_save goes first: joining the next write would overwrite it */
    if (!w->has_report && w->busy && (wait || atomic_load(&w->finished))) rt_ckpt_join(w);
    if (!w->has_report) return 0;
    *d = w->report;
    w->has_report = 0;
    return 1;
}

void rt_ckpt_writer_close(RtCkptWriter *w) {
    if (!w) return;
    rt_ckpt_join(w);
    if (w->lock_fd >= 0) close(w->lock_fd); /* releases the lock */
    free(w->snap_params);
    free(w->snap_state);
    json_decref(w->data_files);
    free(w->dir);
    free(w);
}

/* ---- resuming ---------------------------------------------------------------------------------- */

RtStatus rt_ckpt_resolve(const char *arg, const char *dir, char **path, RtError *err) {
    *path = NULL;
    const char *root = strcmp(arg, "latest") == 0 ? dir : arg;
    char *latest = rt_path_join(root, "latest");
    if (!latest) return rt_fail_errno(err, ENOMEM, "cannot find the checkpoint");
    struct stat sb;
    if (stat(latest, &sb) == 0 && !S_ISREG(sb.st_mode)) { /* a FIFO would block the open below */
        RtStatus st = rt_fail(err, RT_ERR_FORMAT, "cannot resume: '%s' is not a regular file", latest);
        free(latest);
        return st;
    }
    int fd = open(latest, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        free(latest);
        if (root == dir) return rt_fail_errno(err, e, "--resume latest: no checkpoint in '%s' (no file 'latest')", dir);
        *path = strdup(arg); /* a step directory */
        return *path ? RT_OK : rt_fail_errno(err, ENOMEM, "cannot find the checkpoint");
    }
    char text[RT_CKPT_LATEST_MAX + 1];
    int64_t n = rt_pread_all(fd, text, RT_CKPT_LATEST_MAX, 0);
    close(fd);
    if (n < 0) n = 0;
    text[n] = 0;
    /* "NAME\n" RT_CKPT_LATEST_SUM "HEX\n", nothing else */
    char *nl = memchr(text, '\n', (size_t)n), *sum = nl ? nl + 1 : NULL;
    if (nl) *nl = 0;
    size_t klen = strlen(RT_CKPT_LATEST_SUM), dlen = RT_CHECKSUM_CHARS - 1;
    RtStatus st = RT_OK;
    char *state = NULL;
    if (rt_ckpt_step_of(text) < 0) {
        st = rt_fail(err, RT_ERR_FORMAT, "'%s' does not name a checkpoint (it holds '%.40s')", latest, text);
    } else if (!sum || strncmp(sum, RT_CKPT_LATEST_SUM, klen) != 0 || strspn(sum + klen, "0123456789abcdef") != dlen ||
               strcmp(sum + klen + dlen, "\n") != 0) {
        st = rt_fail(err, RT_ERR_FORMAT,
                     "'%s' names '%s' but does not hold its checksum (a second line '" RT_CKPT_LATEST_SUM
                     "<32 hex digits>'): it was damaged, or written by an older runtime; give the checkpoint itself to "
                     "--resume if it is the one wanted",
                     latest, text);
    } else if (!(*path = rt_path_join(root, text)) || !(state = rt_path_join(*path, RT_CKPT_STATE))) {
        st = rt_fail_errno(err, ENOMEM, "cannot find the checkpoint");
    } else {
        char have[RT_CHECKSUM_CHARS];
        st = rt_checksum_file(state, "checkpoint state", have, NULL, err);
        if (st != RT_OK) rt_error_context(err, "'%s' names '%s'", latest, text);
        else if (memcmp(have, sum + klen, dlen) != 0)
            st = rt_fail(err, RT_ERR_FORMAT,
                         "'%s' names '%s', but its state.json has xxh3-128 %s where the pointer records %.32s: the pointer "
                         "or the checkpoint was damaged or changed",
                         latest, text, have, sum + klen);
    }
    if (st != RT_OK) {
        free(*path);
        *path = NULL;
    }
    free(state);
    free(latest);
    return st;
}

/* Appends "; item" to a difference list of at most RT_ERROR_MAX bytes. */
static void rt_diff_add(char *buf, size_t cap, int *n, const char *fmt, ...) RT_PRINTF(4, 5);
static void rt_diff_add(char *buf, size_t cap, int *n, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 8 >= cap) return;
    if (*n > 0) len += (size_t)snprintf(buf + len, cap - len, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    (*n)++;
}

static const json_t *rt_jpath(const json_t *root, const char *a, const char *b) {
    const json_t *v = rt_json_get(root, a);
    return b ? rt_json_get(v, b) : v;
}

/* The shape of a tensor against a parameter's. */
static int rt_same_shape(const RtStTensor *t, const RtParam *q) {
    if (t->rank != q->rank) return 0;
    for (int d = 0; d < q->rank; d++)
        if (t->shape[d] != q->shape[d]) return 0;
    return 1;
}

/* What makes the checkpoint another program's: each difference, in one list. */
static void rt_ckpt_compare(const RtProgram *p, const json_t *root, const RtStFile *model, char *buf, size_t cap, int *n) {
    const RtTrainSettings *t = &p->train;
    const char *hash = rt_json_str(rt_jpath(root, "program", "hash")), *train = rt_json_str(rt_jpath(root, "program", "train"));
    if (train && strcmp(train, t->name) != 0) rt_diff_add(buf, cap, n, "train block '%s', here '%s'", train, t->name);
    /* not accum nor data_ranks: a checkpoint of N data-parallel ranks resumes with M at the same
     * global batch (docs/parallel.md, "Checkpoints across degrees") */
    static const char *const keys[] = {"micro", "seq", "global"};
    const int64_t have[] = {t->micro, t->seq, t->global};
    for (int k = 0; k < 3; k++) {
        int64_t v;
        if (rt_json_i64(rt_jpath(root, "layout", keys[k]), &v) && v != have[k])
            rt_diff_add(buf, cap, n, "%s %lld, here %lld", keys[k], (long long)v, (long long)have[k]);
    }
    const json_t *vars = rt_jpath(root, "optimizer", "state");
    int same_vars = json_is_array(vars) && json_array_size(vars) == (size_t)p->nstate;
    for (int64_t k = 0; same_vars && k < p->nstate; k++) {
        const char *s = rt_json_str(json_array_get(vars, (size_t)k));
        same_vars = s && strcmp(s, p->state_names[k]) == 0;
    }
    if (!same_vars) rt_diff_add(buf, cap, n, "another optimizer (its state variables differ)");
    int64_t matched = 0;
    for (int64_t i = 0; i < p->nparams; i++) {
        const RtParam *q = &p->params[i];
        const RtStTensor *x = rt_st_find(model, q->name);
        if (!x) rt_diff_add(buf, cap, n, "no parameter '%s'", q->name);
        else if (!rt_same_shape(x, q)) rt_diff_add(buf, cap, n, "'%s' has another shape", q->name);
        else matched++;
    }
    for (int64_t i = 0; rt_st_count(model) > matched && i < rt_st_count(model); i++) {
        const RtStTensor *x = rt_st_tensor(model, i);
        int known = 0;
        for (int64_t j = 0; !known && j < p->nparams; j++) known = strcmp(p->params[j].name, x->name) == 0;
        if (!known) rt_diff_add(buf, cap, n, "'%s' is not a parameter here", x->name);
    }
    if (hash && p->hash && strcmp(hash, p->hash) != 0 && *n == 0)
        rt_diff_add(buf, cap, n,
                    "the compiled step differs (program hash %s, here %s): the model's computation, the optimizer, "
                    "the schedule or the batch settings changed",
                    hash, p->hash);
}

/* Checks one file of the checkpoint against the size and checksum state.json gives. */
static RtStatus rt_ckpt_check_file(const char *ckpt, const json_t *files, const char *name, RtError *err) {
    const json_t *f = rt_json_get(files, name);
    int64_t bytes;
    const char *want = rt_json_str(rt_json_get(f, "xxh3_128"));
    if (!f || !want || !rt_json_i64(rt_json_get(f, "bytes"), &bytes))
        return rt_fail(err, RT_ERR_FORMAT, "checkpoint '%s': state.json has no size and checksum for '%s'", ckpt, name);
    char *path = rt_path_join(ckpt, name), sum[RT_CHECKSUM_CHARS];
    if (!path) return rt_fail_errno(err, ENOMEM, "cannot read checkpoint '%s'", ckpt);
    int64_t have = 0;
    RtStatus st = rt_checksum_file(path, "checkpoint file", sum, &have, err);
    if (st == RT_OK && have != bytes)
        st = rt_fail(err, RT_ERR_FORMAT,
                     "checkpoint file '%s' is %lld bytes, but state.json says %lld: it was truncated or changed", path,
                     (long long)have, (long long)bytes);
    else if (st == RT_OK && strcmp(sum, want) != 0)
        st = rt_fail(err, RT_ERR_FORMAT,
                     "checkpoint file '%s' fails its checksum (xxh3-128 %s, state.json says %s): it was damaged or changed", path,
                     sum, want);
    free(path);
    return st;
}

static RtStatus rt_ckpt_bad(RtError *err, const char *path, const char *what) {
    return rt_fail(err, RT_ERR_FORMAT, "checkpoint state '%s': %s", path, what);
}

RtStatus rt_ckpt_load(const RtProgram *p, const char *ckpt, int weights_only, float *params, float *state, RtCkptInfo *info,
                      RtError *err) {
    memset(info, 0, sizeof *info);
    char *spath = rt_path_join(ckpt, RT_CKPT_STATE), *mpath = rt_path_join(ckpt, RT_CKPT_MODEL),
         *opath = rt_path_join(ckpt, RT_CKPT_OPTIM);
    RtText m = {0};
    json_t *root = NULL;
    RtStFile *model = NULL, *optim = NULL;
    RtStatus st = spath && mpath && opath ? RT_OK : rt_fail_errno(err, ENOMEM, "cannot read checkpoint '%s'", ckpt);
    if (st == RT_OK) st = rt_read_file(spath, "checkpoint state", RT_CKPT_STATE_MAX, &m.data, &m.size, err);
    if (st == RT_OK) {
        char what[4200];
        snprintf(what, sizeof what, "checkpoint state '%s'", spath);
        st = rt_json_parse(&root, m.data, m.size, 0, what, err);
    }
    int64_t version = 0;
    const char *fmt = rt_json_str(rt_json_get(root, "format")), *fp = rt_json_str(rt_jpath(root, "data", "fingerprint"));
    if (st == RT_OK && (!fmt || strcmp(fmt, RT_CKPT_FORMAT) != 0))
        st = rt_ckpt_bad(err, spath, "not an mbt checkpoint (no \"format\": \"mbt-checkpoint\")");
    if (st == RT_OK && (!rt_json_i64(rt_json_get(root, "version"), &version) || version != RT_CKPT_VERSION))
        st = rt_fail(err, RT_ERR_FORMAT, "checkpoint state '%s': version %lld, but this runtime reads version %d", spath,
                     (long long)version, RT_CKPT_VERSION);
    if (st == RT_OK && (!rt_json_i64(rt_json_get(root, "step"), &info->step) || info->step < 0 ||
                        !rt_json_u64(rt_jpath(root, "rng", "seed"), &info->seed) ||
                        !rt_json_u64(rt_jpath(root, "data", "epoch"), &info->data.epoch) ||
                        !rt_json_u64(rt_jpath(root, "data", "shard"), &info->data.shard) ||
                        !rt_json_u64(rt_jpath(root, "data", "window"), &info->data.window) || !fp || strlen(fp) != 16 ||
                        sscanf(fp, "%16" SCNx64, &info->data.fingerprint) != 1))
        st = rt_ckpt_bad(err, spath, "the step, the seed or the data position is missing or malformed");
    if (st == RT_OK) {
        rt_json_f64(rt_jpath(root, "schedule", "loss"), &info->loss);
        rt_json_f64(rt_jpath(root, "schedule", "lr"), &info->lr);
        const json_t *df = rt_jpath(root, "data", "files");
        if (!json_is_array(df)) st = rt_ckpt_bad(err, spath, "no list of the training files (data.files)");
        else if (!(info->data_files = calloc(json_array_size(df) + 1, sizeof *info->data_files)))
            st = rt_fail_errno(err, ENOMEM, "cannot read checkpoint '%s'", ckpt);
        for (int64_t i = 0; st == RT_OK && i < (int64_t)json_array_size(df); i++) {
            struct RtCkptData *d = &info->data_files[i];
            const json_t *item = json_array_get(df, (size_t)i);
            const char *path = rt_json_str(rt_json_get(item, "path")), *sum = rt_json_str(rt_json_get(item, "sample_xxh3_128"));
            if (!path || !sum || strlen(sum) != RT_CHECKSUM_CHARS - 1 || !rt_json_i64(rt_json_get(item, "bytes"), &d->bytes))
                st = rt_ckpt_bad(err, spath, "a training file's entry (data.files) is malformed");
            else if (!(d->path = strdup(path))) st = rt_fail_errno(err, ENOMEM, "cannot read checkpoint '%s'", ckpt);
            else {
                memcpy(d->sample, sum, RT_CHECKSUM_CHARS);
                info->ndata = i + 1;
            }
        }
    }
    if (st == RT_OK) st = rt_ckpt_check_self(spath, root, &m, err);
    const json_t *files = rt_json_get(root, "files");
    if (st == RT_OK) st = rt_ckpt_check_file(ckpt, files, RT_CKPT_MODEL, err);
    if (st == RT_OK && !weights_only) st = rt_ckpt_check_file(ckpt, files, RT_CKPT_OPTIM, err);
    if (st == RT_OK) st = rt_st_open(&model, mpath, err);
    if (st == RT_OK && !weights_only) {
        char diff[RT_ERROR_MAX];
        diff[0] = 0;
        int n = 0;
        rt_ckpt_compare(p, root, model, diff, sizeof diff, &n);
        if (n > 0)
            st = rt_fail(err, RT_ERR_ARG,
                         "checkpoint '%s' is not of this program: %s (--resume-weights-only takes its weights and starts afresh)",
                         ckpt, diff);
    }
    if (st == RT_OK) {
        int64_t unused = 0;
        st = rt_weights_load(p, params, mpath, &unused, err);
    }
    if (st == RT_OK && !weights_only) {
        st = rt_st_open(&optim, opath, err);
        for (int64_t k = 0; st == RT_OK && k < p->nstate; k++)
            for (int64_t i = 0; st == RT_OK && i < p->nparams; i++) {
                const RtParam *q = &p->params[i];
                if (!rt_has_state(p, q)) continue; /* frozen: no optimizer state */
                char name[1024];
                snprintf(name, sizeof name, "%s.%s", q->name, p->state_names[k]);
                const RtStTensor *x = rt_st_find(optim, name);
                if (!x || !rt_same_shape(x, q))
                    st = rt_fail(err, RT_ERR_FORMAT, "checkpoint file '%s' has no tensor '%s' shaped like the parameter", opath,
                                 name);
                else st = rt_st_read_f32(optim, x, state + k * rt_state_part(p) + q->offset, q->numel, err);
            }
    }
    if (weights_only || st != RT_OK) {
        rt_ckpt_info_free(info);
        memset(info, 0, sizeof *info);
    }
    rt_st_close(model);
    rt_st_close(optim);
    json_decref(root);
    free(m.data);
    free(spath);
    free(mpath);
    free(opath);
    return st;
}

void rt_ckpt_info_free(RtCkptInfo *info) {
    for (int64_t i = 0; i < info->ndata; i++) free(info->data_files[i].path);
    free(info->data_files);
    info->data_files = NULL;
    info->ndata = 0;
}

RtStatus rt_ckpt_check_data(const RtCkptInfo *info, const char *ckpt, const RtData *train, RtError *err) {
    if (info->ndata != rt_data_nfiles(train))
        return rt_fail(err, RT_ERR_ARG,
                       "checkpoint '%s': the training data are not those it was trained on (%lld files then, %lld now)", ckpt,
                       (long long)info->ndata, (long long)rt_data_nfiles(train));
    for (int64_t i = 0; i < info->ndata; i++) {
        char sum[RT_CHECKSUM_CHARS];
        int64_t bytes = 0;
        RtStatus st = rt_checksum_sample(rt_data_file(train, i), "data shard", sum, &bytes, err);
        if (st != RT_OK) return st;
        if (bytes != info->data_files[i].bytes || strcmp(sum, info->data_files[i].sample) != 0)
            return rt_fail(err, RT_ERR_ARG,
                           "checkpoint '%s': the training data are not those it was trained on: file %lld, '%s' (%lld bytes), "
                           "is not '%s' (%lld bytes; sampled checksums %s and %s)",
                           ckpt, (long long)(i + 1), rt_data_file(train, i), (long long)bytes, info->data_files[i].path,
                           (long long)info->data_files[i].bytes, sum, info->data_files[i].sample);
    }
    return RT_OK;
}
