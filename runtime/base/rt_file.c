/* rt_file.c - files for the runtime: regular files opened and read with pread, and atomic writes
 * (see rt.h).
 *
 * Pipeline position: under data.c (token shards are read window by window), safetensors.c
 * (tensors are read chunk by chunk; checkpoints are written atomically), checkpoint.c (state.json
 * read whole) and the checksums of checkpoint files. Nothing is memory-mapped: a mapped file that
 * another process truncates raises SIGBUS on the next access, where a short pread is a message. An atomic write goes to
 * a temporary file in the destination's directory; commit fsyncs it, renames it over the
 * destination and fsyncs the directory, so a crash or a failed write leaves either the old file
 * or the new one, never a mixture. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL /* header-only: executables link no xxhash library */
#include <xxhash.h>

#include "rt.h"

/* ---- reading ----------------------------------------------------------------------------------- */

const char *rt_file_kind(unsigned m) {
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

int64_t rt_pread_all(int fd, void *buf, int64_t n, int64_t off) {
    int64_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (unsigned char *)buf + got, (size_t)(n - got), (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += k;
    }
    return got;
}

RtStatus rt_read_file(const char *path, const char *what, int64_t max_bytes, unsigned char **data, size_t *size, RtError *err) {
    *data = NULL;
    *size = 0;
    int fd;
    int64_t fsize;
    RtStatus rs = rt_open_regular(path, what, &fd, &fsize, err);
    if (rs != RT_OK) return rs;
    if (fsize > max_bytes || (uint64_t)fsize >= (uint64_t)SIZE_MAX) {
        close(fd);
        return rt_fail(err, RT_ERR_FORMAT, "%s '%s' is %lld bytes, over the limit of %lld", what, path, (long long)fsize,
                       (long long)max_bytes);
    }
    unsigned char *buf = malloc((size_t)fsize + 1);
    if (!buf) {
        close(fd);
        return rt_fail_errno(err, ENOMEM, "cannot read %s '%s' (%lld bytes)", what, path, (long long)fsize);
    }
    int64_t got = rt_pread_all(fd, buf, fsize, 0);
    int e = errno;
    close(fd);
    if (got < 0) {
        free(buf);
        return rt_fail_errno(err, e, "cannot read %s '%s'", what, path);
    }
    if (got < fsize) {
        free(buf);
        return rt_fail(err, RT_ERR_IO, "%s '%s' shrank while it was read: %lld bytes were there, %lld could be read", what, path,
                       (long long)fsize, (long long)got);
    }
    buf[fsize] = 0;
    *data = buf;
    *size = (size_t)fsize;
    return RT_OK;
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

/* Feeds len bytes of fd from off to the hash, 1 MiB at a time; a file that ends early (it shrank
 * since its size was taken) is an error. */
static RtStatus rt_hash_range(XXH3_state_t *h, int fd, int64_t off, int64_t len, unsigned char *buf, const char *what,
                              const char *path, RtError *err) {
    const int64_t chunk = (int64_t)1 << 20;
    for (int64_t done = 0; done < len;) {
        int64_t want = len - done < chunk ? len - done : chunk;
        int64_t got = rt_pread_all(fd, buf, want, off + done);
        if (got < 0) return rt_fail_errno(err, errno, "cannot read %s '%s'", what, path);
        if (got < want)
            return rt_fail(err, RT_ERR_IO, "%s '%s' shrank while it was read: it ends at byte %lld", what, path,
                           (long long)(off + done + got));
        XXH3_128bits_update(h, buf, (size_t)got);
        done += got;
    }
    return RT_OK;
}

/* The whole file (sample 0) or its size, first and last MiB (sample 1), hashed with XXH3-128;
 * the streamed hash equals the one-shot XXH3_128bits of the same bytes. */
static RtStatus rt_checksum_fd(const char *path, const char *what, int sample, char out[RT_CHECKSUM_CHARS], int64_t *bytes,
                               RtError *err) {
    int fd;
    int64_t size;
    RtStatus st = rt_open_regular(path, what, &fd, &size, err);
    if (st != RT_OK) return st;
    const int64_t part = (int64_t)1 << 20;
    unsigned char *buf = malloc((size_t)part);
    if (!buf) {
        close(fd);
        return rt_fail_errno(err, ENOMEM, "cannot read %s '%s'", what, path);
    }
    XXH3_state_t s;
    XXH3_128bits_reset(&s);
    if (sample) {
        uint64_t u = (uint64_t)size;
        XXH3_128bits_update(&s, &u, sizeof u);
    }
    if (!sample || size <= 2 * part) {
        st = rt_hash_range(&s, fd, 0, size, buf, what, path, err);
    } else {
        st = rt_hash_range(&s, fd, 0, part, buf, what, path, err);
        if (st == RT_OK) st = rt_hash_range(&s, fd, size - part, part, buf, what, path, err);
    }
    free(buf);
    close(fd);
    if (st != RT_OK) return st;
    rt_checksum_hex(XXH3_128bits_digest(&s), out);
    if (bytes) *bytes = size;
    return RT_OK;
}

RtStatus rt_checksum_file(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err) {
    return rt_checksum_fd(path, what, 0, out, bytes, err);
}

RtStatus rt_checksum_sample(const char *path, const char *what, char out[RT_CHECKSUM_CHARS], int64_t *bytes, RtError *err) {
    return rt_checksum_fd(path, what, 1, out, bytes, err);
}
