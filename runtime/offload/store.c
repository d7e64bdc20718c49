/* store.c - the NVMe store (rt_store.h): one file of fixed size, asynchronous aligned reads and
 * writes through io_uring, or through one worker thread doing pread/pwrite where io_uring is refused.
 *
 * Pipeline position: under the train loop's optimizer-state offload (and activation offload). The
 * store knows nothing of tensors: it moves 4096-byte aligned byte ranges between memory and a file.
 *
 * Why these choices (docs/memory.md, "The NVMe store"):
 * - O_DIRECT, so that streaming gigabytes of optimizer state through the store does not push the
 *   page cache (and with it the data shards) out of memory; it needs aligned buffers, offsets and
 *   lengths, which the API demands of every request rather than bouncing through a copy.
 * - The file is allocated in full at open (fallocate), so that a disk too small is an error before
 *   the first step, and the file reads as zeros until written (the moments' initial value).
 * - A request whose transfer comes back short is resubmitted for the rest; a transfer of 0 bytes or
 *   an error fails the store with the file, the request's byte range and the reason. The first
 *   failure is kept and is sticky: the caller's data is then in an unknown state.
 * - A file removed from its directory keeps working through its descriptor, which would hide the
 *   loss until the run ends; rt_store_wait checks that the path still names the file it opened. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_store.h"

#define STORE_DEPTH 64 /* io_uring entries: requests in flight at once */

typedef struct StoreReq {
    int write;
    size_t off, len, done; /* the request's range and how much of it has moved */
    char *buf;
    struct StoreReq *next; /* the worker thread's queue */
} StoreReq;

struct RtStore {
    int fd;
    char path[4096];
    size_t bytes;
    int direct, uring;
    dev_t dev;
    ino_t ino;
    char note[512];
    char err[4096 + 512]; /* room for the path and the rest */
    int failed;
    /* io_uring */
    struct io_uring ring;
    StoreReq reqs[STORE_DEPTH];
    int free_slots[STORE_DEPTH], nfree, inflight;
    /* the worker thread */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    StoreReq *head, *tail;
    int pending, stop, thread_started;
};

/* ---- memory ------------------------------------------------------------------------------- */

size_t rt_store_align(size_t n) { return (n + RT_STORE_ALIGN - 1) / RT_STORE_ALIGN * RT_STORE_ALIGN; }

void *rt_store_alloc(size_t n) {
    size_t len = rt_store_align(n ? n : 1);
    void *p = aligned_alloc(RT_STORE_ALIGN, len);
    if (p) memset(p, 0, len);
    return p;
}

void rt_store_free(void *p) { free(p); }

/* ---- errors --------------------------------------------------------------------------------- */

static void store_fail(RtStore *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void store_fail(RtStore *s, const char *fmt, ...) {
    if (s->failed) return; /* the first failure is the one worth reading */
    s->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

/* A request that failed: the file, the request's byte range, the reason. */
static void store_fail_req(RtStore *s, const StoreReq *r, int errnum) {
    char buf[256];
    const char *why = strerror_r(errnum, buf, sizeof buf);
    store_fail(s, "store file '%s': %s bytes [%zu, %zu) failed after %zu bytes: %s", s->path, r->write ? "writing" : "reading",
               r->off, r->off + r->len, r->done, why);
}

static void store_fail_short(RtStore *s, const StoreReq *r) {
    store_fail(s, "store file '%s': short %s of bytes [%zu, %zu): %zu of %zu bytes moved, then none", s->path,
               r->write ? "write" : "read", r->off, r->off + r->len, r->done, r->len);
}

const char *rt_store_error(const RtStore *s) { return s ? s->err : "no store"; }
const char *rt_store_note(const RtStore *s) { return s ? s->note : ""; }
const char *rt_store_path(const RtStore *s) { return s ? s->path : ""; }
size_t rt_store_size(const RtStore *s) { return s ? s->bytes : 0; }
int rt_store_direct(const RtStore *s) { return s ? s->direct : 0; }
int rt_store_uring(const RtStore *s) { return s ? s->uring : 0; }

/* ---- io_uring ------------------------------------------------------------------------------- */

static int uring_queue(RtStore *s, StoreReq *r, int slot) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) { /* cannot happen: at most STORE_DEPTH requests are in flight, each submitted at once */
        store_fail(s, "store file '%s': io_uring has no free submission entry", s->path);
        return -1;
    }
    if (r->write) io_uring_prep_write(sqe, s->fd, r->buf + r->done, (unsigned)(r->len - r->done), r->off + r->done);
    else io_uring_prep_read(sqe, s->fd, r->buf + r->done, (unsigned)(r->len - r->done), r->off + r->done);
    io_uring_sqe_set_data64(sqe, (uint64_t)slot);
    int rc;
    do rc = io_uring_submit(&s->ring);
    while (rc == -EINTR);
    if (rc < 0) {
        store_fail_req(s, r, -rc);
        return -1;
    }
    return 0;
}

/* Waits for one completion and handles it: done, resubmitted for the rest, or failed. */
static void uring_reap_one(RtStore *s) {
    struct io_uring_cqe *cqe;
    int rc;
    do rc = io_uring_wait_cqe(&s->ring, &cqe);
    while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) { /* the ring itself failed: nothing more can be learnt of what is in flight */
        char buf[256];
        store_fail(s, "store file '%s': waiting for io_uring: %s", s->path, strerror_r(-rc, buf, sizeof buf));
        s->inflight = 0;
        return;
    }
    int slot = (int)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&s->ring, cqe);
    StoreReq *r = &s->reqs[slot];
    if (res == -EINTR || res == -EAGAIN) {
        if (uring_queue(s, r, slot) == 0) return;
    } else if (res < 0) store_fail_req(s, r, -res);
    else if (res == 0) store_fail_short(s, r);
    else {
        r->done += (size_t)res;
        if (r->done < r->len && uring_queue(s, r, slot) == 0) return; /* still in flight */
    }
    s->free_slots[s->nfree++] = slot;
    s->inflight--;
}

/* ---- the worker thread ---------------------------------------------------------------------- */

static void thread_do(RtStore *s, StoreReq *r) {
    while (r->done < r->len) {
        ssize_t n = r->write ? pwrite(s->fd, r->buf + r->done, r->len - r->done, (off_t)(r->off + r->done))
                             : pread(s->fd, r->buf + r->done, r->len - r->done, (off_t)(r->off + r->done));
        if (n < 0 && errno == EINTR) continue;
        int errnum = errno;
        if (n <= 0) {
            pthread_mutex_lock(&s->mu);
            if (n < 0) store_fail_req(s, r, errnum);
            else store_fail_short(s, r);
            pthread_mutex_unlock(&s->mu);
            return;
        }
        r->done += (size_t)n;
    }
}

static void *thread_main(void *arg) {
    RtStore *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (!s->head) break; /* stopping, and nothing left */
        StoreReq *r = s->head;
        s->head = r->next;
        if (!s->head) s->tail = NULL;
        int skip = s->failed; /* after a failure the data is lost anyway: drain the queue */
        pthread_mutex_unlock(&s->mu);
        if (!skip) thread_do(s, r);
        free(r);
        pthread_mutex_lock(&s->mu);
        if (--s->pending == 0) pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- requests ------------------------------------------------------------------------------- */

static int store_submit(RtStore *s, int write, size_t off, void *buf, size_t len) {
    if (!s) return -1;
    if (s->uring) {
        if (s->failed) return -1;
    } else {
        pthread_mutex_lock(&s->mu);
        int failed = s->failed;
        pthread_mutex_unlock(&s->mu);
        if (failed) return -1;
    }
    const char *what = write ? "write" : "read";
    /* an argument error, not an I/O failure: reported, but the store stays usable */
    if (!s->uring) pthread_mutex_lock(&s->mu);
    int bad = 1;
    if (off % RT_STORE_ALIGN || len % RT_STORE_ALIGN || (uintptr_t)buf % RT_STORE_ALIGN) {
        snprintf(s->err, sizeof s->err, "store file '%s': %s of %zu bytes at offset %zu from %p is not aligned to %d bytes",
                 s->path, what, len, off, buf, RT_STORE_ALIGN);
    } else if (off > s->bytes || len > s->bytes - off) {
        snprintf(s->err, sizeof s->err, "store file '%s': %s of bytes [%zu, %zu) is past its end (%zu bytes)", s->path, what, off,
                 off + len, s->bytes);
    } else bad = 0;
    if (!s->uring) pthread_mutex_unlock(&s->mu);
    if (bad) return -1;
    if (len == 0) return 0;
    if (s->uring) {
        /* a request larger than one transfer can say (unsigned) is split */
        const size_t max = (size_t)1 << 30;
        for (size_t at = 0; at < len; at += max) {
            while (s->nfree == 0) uring_reap_one(s);
            if (s->failed) return -1;
            int slot = s->free_slots[--s->nfree];
            StoreReq *r = &s->reqs[slot];
            *r = (StoreReq){.write = write, .off = off + at, .len = len - at < max ? len - at : max, .buf = (char *)buf + at};
            s->inflight++;
            if (uring_queue(s, r, slot) != 0) {
                s->free_slots[s->nfree++] = slot;
                s->inflight--;
                return -1;
            }
        }
        return 0;
    }
    StoreReq *r = malloc(sizeof *r);
    if (!r) {
        pthread_mutex_lock(&s->mu);
        store_fail(s, "store file '%s': out of memory queueing a %s", s->path, what);
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    *r = (StoreReq){.write = write, .off = off, .len = len, .buf = buf};
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = r;
    else s->head = r;
    s->tail = r;
    s->pending++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int rt_store_write(RtStore *s, size_t off, const void *buf, size_t len) { return store_submit(s, 1, off, (void *)buf, len); }

int rt_store_read(RtStore *s, size_t off, void *buf, size_t len) { return store_submit(s, 0, off, buf, len); }

int rt_store_wait(RtStore *s) {
    if (!s) return -1;
    int failed;
    if (s->uring) {
        while (s->inflight > 0) uring_reap_one(s);
        failed = s->failed;
    } else {
        pthread_mutex_lock(&s->mu);
        while (s->pending > 0) pthread_cond_wait(&s->idle, &s->mu);
        failed = s->failed;
        pthread_mutex_unlock(&s->mu);
    }
    if (failed) return -1;
    /* the descriptor outlives the name: a store whose file was removed (its directory deleted, a
     * cleaner run) would go on working in memory nobody can see, and its space be lost at exit */
    struct stat st;
    if (stat(s->path, &st) != 0) {
        char buf[256];
        const char *why = strerror_r(errno, buf, sizeof buf);
        if (!s->uring) pthread_mutex_lock(&s->mu);
        store_fail(s, "store file '%s' has vanished (bytes [0, %zu)): %s", s->path, s->bytes, why);
        if (!s->uring) pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (st.st_dev != s->dev || st.st_ino != s->ino) {
        if (!s->uring) pthread_mutex_lock(&s->mu);
        store_fail(s, "store file '%s' has been replaced by another file (bytes [0, %zu) are lost)", s->path, s->bytes);
        if (!s->uring) pthread_mutex_unlock(&s->mu);
        return -1;
    }
    return 0;
}

/* ---- open and close ------------------------------------------------------------------------- */

RtStore *rt_store_open(const char *dir, const char *name, size_t bytes, char *err, size_t errlen) {
    char ebuf[256];
    if (!dir || !*dir || !name || !*name || strchr(name, '/')) {
        snprintf(err, errlen, "store: a directory and a plain file name are needed");
        return NULL;
    }
    if (bytes == 0 || bytes % RT_STORE_ALIGN) {
        snprintf(err, errlen, "store file '%s/%s': its size (%zu bytes) is not a positive multiple of %d", dir, name, bytes,
                 RT_STORE_ALIGN);
        return NULL;
    }
    struct stat dst;
    if (stat(dir, &dst) != 0) {
        snprintf(err, errlen, "store directory '%s': %s", dir, strerror_r(errno, ebuf, sizeof ebuf));
        return NULL;
    }
    if (!S_ISDIR(dst.st_mode)) {
        snprintf(err, errlen, "store directory '%s' is not a directory", dir);
        return NULL;
    }
    RtStore *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "store file '%s/%s': out of memory", dir, name);
        return NULL;
    }
    s->fd = -1;
    s->bytes = bytes;
    if ((size_t)snprintf(s->path, sizeof s->path, "%s/%s", dir, name) >= sizeof s->path) {
        snprintf(err, errlen, "store file '%s/%s': the path is too long", dir, name);
        free(s);
        return NULL;
    }
    /* O_DIRECT where the file system takes it (open refuses it with EINVAL where not) */
    s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    s->direct = s->fd >= 0;
    if (s->fd < 0 && errno == EINVAL) s->fd = open(s->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        snprintf(err, errlen, "cannot create the store file '%s': %s", s->path, strerror_r(errno, ebuf, sizeof ebuf));
        free(s);
        return NULL;
    }
    struct stat st;
    int rc = fstat(s->fd, &st) == 0 ? 0 : errno;
    if (!rc) {
        s->dev = st.st_dev;
        s->ino = st.st_ino;
        /* allocated in full now: a full disk fails here, before the first step */
        if (fallocate(s->fd, 0, 0, (off_t)bytes) != 0) {
            rc = errno;
            if (rc == EOPNOTSUPP || rc == ENOSYS) rc = ftruncate(s->fd, (off_t)bytes) == 0 ? 0 : errno;
        }
    }
    if (rc) {
        snprintf(err, errlen, "cannot allocate the store file '%s' (%zu bytes): %s", s->path, bytes,
                 strerror_r(rc, ebuf, sizeof ebuf));
        close(s->fd);
        unlink(s->path);
        free(s);
        return NULL;
    }
    const char *force = getenv("MBT_STORE_IO");
    int want_uring = !(force && strcmp(force, "thread") == 0);
    int urc = want_uring ? io_uring_queue_init(STORE_DEPTH, &s->ring, 0) : -1;
    s->uring = urc == 0;
    if (s->uring) {
        for (int i = 0; i < STORE_DEPTH; i++) s->free_slots[i] = STORE_DEPTH - 1 - i;
        s->nfree = STORE_DEPTH;
    } else {
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->work, NULL);
        pthread_cond_init(&s->idle, NULL);
        int prc = pthread_create(&s->thread, NULL, thread_main, s);
        if (prc) {
            snprintf(err, errlen, "store file '%s': cannot start its I/O thread: %s", s->path,
                     strerror_r(prc, ebuf, sizeof ebuf));
            close(s->fd);
            unlink(s->path);
            free(s);
            return NULL;
        }
        s->thread_started = 1;
    }
    int n = 0;
    if (!s->direct) n += snprintf(s->note + n, sizeof s->note - n, "the file system of '%s' refuses O_DIRECT: buffered I/O", dir);
    if (!s->uring) {
        if (n) n += snprintf(s->note + n, sizeof s->note - n, "; ");
        if (want_uring)
            snprintf(s->note + n, sizeof s->note - n, "io_uring is refused here (%s): a worker thread does pread/pwrite",
                     strerror_r(-urc, ebuf, sizeof ebuf));
        else snprintf(s->note + n, sizeof s->note - n, "MBT_STORE_IO=thread: a worker thread does pread/pwrite");
    }
    return s;
}

void rt_store_close(RtStore *s) {
    if (!s) return;
    if (s->uring) {
        while (s->inflight > 0) uring_reap_one(s);
        io_uring_queue_exit(&s->ring);
    } else if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->idle);
    }
    if (s->fd >= 0) close(s->fd);
    /* removed only if the path still names our file: never someone else's */
    struct stat st;
    if (stat(s->path, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino) unlink(s->path);
    free(s);
}
