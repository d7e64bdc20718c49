/* rt_file.c - files for the runtime: whole files mapped read-only, and atomic writes (see rt.h).
 *
 * Pipeline position: under data.c (token shards are mapped, never read whole) and
 * safetensors.c (checkpoints are mapped to read, and written atomically). An atomic write goes to
 * a temporary file in the destination's directory; commit fsyncs it, renames it over the
 * destination and fsyncs the directory, so a crash or a failed write leaves either the old file
 * or the new one, never a mixture. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL /* header-only: executables link no xxhash library */
#include <xxhash.h>

#include "rt.h"

/* ---- mapping ----------------------------------------------------------------------------------- */

static const char *rt_file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a regular file";
}

RtStatus rt_open_regular(const char *path, const char *what, int *fd, int64_t *size, RtError *err) {
    *fd = -1;
    *size = 0;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (f < 0) return rt_fail_errno(err, errno, "cannot open %s '%s'", what, path);
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return rt_fail_errno(err, e, "cannot stat %s '%s'", what, path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        const char *kind = rt_file_kind(st.st_mode);
        return rt_fail(err, RT_ERR_FORMAT, "%s '%s' is %s%s", what, path, kind,
                       strcmp(kind, "not a regular file") ? ", not a regular file" : "");
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return rt_fail_errno(err, e, "cannot open %s '%s'", what, path);
    }
    *fd = f;
    *size = (int64_t)st.st_size;
    return RT_OK;
}

RtStatus rt_map_file(RtMap *m, const char *path, const char *what, RtError *err) {
    m->data = NULL;
    m->size = 0;
    int fd;
    int64_t fsize;
    RtStatus rs = rt_open_regular(path, what, &fd, &fsize, err);
    if (rs != RT_OK) return rs;
    if ((uint64_t)fsize > (uint64_t)SIZE_MAX) {
        close(fd);
        return rt_fail(err, RT_ERR_FORMAT, "%s '%s' is too large to map", what, path);
    }
    size_t size = (size_t)fsize;
    if (size > 0) {
        void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return rt_fail_errno(err, e, "cannot map %s '%s' into memory", what, path);
        }
        m->data = p;
        m->size = size;
    }
    /* The mapping outlives the descriptor. */
    if (close(fd) != 0) {
        int e = errno;
        rt_unmap(m);
        return rt_fail_errno(err, e, "cannot close %s '%s'", what, path);
    }
    return RT_OK;
}

void rt_unmap(RtMap *m) {
    if (m->data && m->size) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

/* ---- writing ----------------------------------------------------------------------------------- */

RtStatus rt_write_all(int fd, const void *buf, size_t n, const char *what, const char *path, RtError *err) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return rt_fail_errno(err, errno, "cannot write %s '%s'", what, path);
        }
        if (k == 0) return rt_fail(err, RT_ERR_IO, "cannot write %s '%s': write made no progress", what, path);
        p += k;
        n -= (size_t)k;
    }
    return RT_OK;
}

/* The directory holding path ("." for a bare name), malloc'd. */
static char *rt_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

RtStatus rt_atomic_begin(RtAtomicFile *f, const char *path, const char *what, RtError *err) {
    f->fd = -1;
    f->tmp = NULL;
    f->what = what;
    f->path = strdup(path);
    if (!f->path) return rt_fail_errno(err, ENOMEM, "cannot write %s '%s'", what, path);
    size_t cap = strlen(path) + 64;
    f->tmp = malloc(cap);
    if (!f->tmp) {
        rt_atomic_abort(f);
        return rt_fail_errno(err, ENOMEM, "cannot write %s '%s'", what, path);
    }
    /* The pid keeps concurrent writers (ranks) apart; the counter steps over leftovers of a
     * crashed earlier run with the same pid. */
    for (int n = 0; n < 1000; n++) {
        snprintf(f->tmp, cap, "%s.tmp.%ld.%d", path, (long)getpid(), n);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (f->fd >= 0) return RT_OK;
        if (errno != EEXIST) break;
    }
    int e = errno;
    RtStatus st = rt_fail_errno(err, e, "cannot create %s '%s' (temporary file '%s')", what, path, f->tmp);
    free(f->tmp); /* not ours to remove: we never created it */
    f->tmp = NULL;
    rt_atomic_abort(f);
    return st;
}

RtStatus rt_atomic_write(RtAtomicFile *f, const void *buf, size_t n, RtError *err) {
    if (f->fd < 0) return rt_fail(err, RT_ERR_ARG, "cannot write %s '%s': it is not open", f->what, f->path);
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = write(f->fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return rt_fail_errno(err, errno, "cannot write %s '%s' (temporary file '%s')", f->what, f->path, f->tmp);
        }
        if (k == 0)
            return rt_fail(err, RT_ERR_IO, "cannot write %s '%s' (temporary file '%s'): write made no progress", f->what, f->path,
                           f->tmp);
        p += k;
        n -= (size_t)k;
    }
    return RT_OK;
}

RtStatus rt_atomic_commit(RtAtomicFile *f, RtError *err) {
    if (f->fd < 0) return rt_fail(err, RT_ERR_ARG, "cannot finish %s: it is not open", f->what);
    if (fsync(f->fd) != 0) {
        RtStatus st = rt_fail_errno(err, errno, "cannot flush %s '%s' (temporary file '%s') to disk", f->what, f->path, f->tmp);
        rt_atomic_abort(f);
        return st;
    }
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0) {
        RtStatus st = rt_fail_errno(err, errno, "cannot close %s '%s' (temporary file '%s')", f->what, f->path, f->tmp);
        rt_atomic_abort(f);
        return st;
    }
    if (rename(f->tmp, f->path) != 0) {
        RtStatus st = rt_fail_errno(err, errno, "cannot rename '%s' to %s '%s'", f->tmp, f->what, f->path);
        rt_atomic_abort(f);
        return st;
    }
    free(f->tmp);
    f->tmp = NULL; /* renamed: nothing left to remove */
    /* The rename is durable only once the directory is. */
    char *dir = rt_dirname(f->path);
    RtStatus st =
        dir ? rt_fsync_dir(dir, err) : rt_fail_errno(err, ENOMEM, "cannot sync the directory of %s '%s'", f->what, f->path);
    if (st != RT_OK) rt_error_context(err, "after writing %s '%s'", f->what, f->path);
    free(dir);
    rt_atomic_abort(f);
    return st;
}

RtStatus rt_atomic_write_file(const char *path, const char *what, const void *buf, size_t n, RtError *err) {
    RtAtomicFile f;
    RtStatus st = rt_atomic_begin(&f, path, what, err);
    if (st != RT_OK) return st;
    st = rt_atomic_write(&f, buf, n, err);
    if (st == RT_OK) return rt_atomic_commit(&f, err);
    rt_atomic_abort(&f);
    return st;
}

RtStatus rt_fsync_dir(const char *dir, RtError *err) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return rt_fail_errno(err, errno, "cannot open directory '%s' to sync it", dir);
    RtStatus st = RT_OK;
    /* Some file systems cannot sync a directory (EINVAL): there is nothing more to do. */
    if (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) st = rt_fail_errno(err, errno, "cannot sync directory '%s'", dir);
    if (close(dfd) != 0 && st == RT_OK) st = rt_fail_errno(err, errno, "cannot close directory '%s'", dir);
    return st;
}

void rt_atomic_abort(RtAtomicFile *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    /* Cleanup on a path that already failed: a leftover temporary file is the worst outcome. */
    if (f->tmp) unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
    free(f->path);
    f->path = NULL;
}

/* ---- checksums --------------------------------------------------------------------------------- */

static void rt_checksum_hex(XXH128_hash_t h, char out[RT_CHECKSUM_CHARS]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[c.digest[i] >> 4];
        out[2 * i + 1] = digits[c.digest[i] & 15];
    }
    out[32] = 0;
}

void rt_checksum(const void *data, size_t n, char out[RT_CHECKSUM_CHARS]) { rt_checksum_hex(XXH3_128bits(data, n), out); }

RtStatus rt_checksum_file(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err) {
    RtMap m;
    RtStatus st = rt_map_file(&m, path, what, err);
    if (st != RT_OK) return st;
    rt_checksum(m.data, m.size, out);
    if (bytes) *bytes = (int64_t)m.size;
    rt_unmap(&m);
    return RT_OK;
}

RtStatus rt_checksum_sample(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err) {
    RtMap m;
    RtStatus st = rt_map_file(&m, path, what, err);
    if (st != RT_OK) return st;
    const size_t part = (size_t)1 << 20;
    XXH3_state_t s;
    XXH3_128bits_reset(&s);
    uint64_t size = m.size;
    XXH3_128bits_update(&s, &size, sizeof size);
    if (m.size <= 2 * part) {
        XXH3_128bits_update(&s, m.data, m.size);
    } else {
        XXH3_128bits_update(&s, m.data, part);
        XXH3_128bits_update(&s, m.data + m.size - part, part);
    }
    rt_checksum_hex(XXH3_128bits_digest(&s), out);
    if (bytes) *bytes = (int64_t)m.size;
    rt_unmap(&m);
    return RT_OK;
}
