/* test_rt_store.c - unit tests of runtime/offload/store.c, the NVMe store: what is written reads
 * back, with many requests outstanding, through io_uring and through the worker thread that
 * replaces it where io_uring is refused (MBT_STORE_IO=thread); a write past RLIMIT_FSIZE (a disk
 * that fills, simulated: SIGXFSZ ignored, so the write fails with EFBIG) and a file removed under
 * the store are errors naming the file, the byte range and the reason; a directory that does not
 * exist and unaligned arguments are refused; closing removes the file.
 *
 * Build: make build/tests/test_rt_store (links build/libmbtrt.a and liburing). Prints `PASS name`
 * or `FAIL name: why` per case, then `N passed, M failed`; exits 1 on a failure. Each case runs
 * in a child process (unit.h), so setenv and setrlimit stay inside it. */
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>

#include "rt_store.h"
#include "unit.h"
#include "scratch.h"

#define KB 1024

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 12));
}

/* Writes 1 MiB in 4 requests, reads it back in 16 others, closes: the file is gone. */
static void round_trip_with(const char *io) {
    if (io) setenv("MBT_STORE_IO", io, 1);
    char err[512] = "";
    size_t n = 1024 * KB;
    RtStore *s = rt_store_open(dir, "rt.store", n, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    CHECK(strcmp(rt_store_path(s), at("rt.store")) == 0, "path %s", rt_store_path(s));
    CHECK(rt_store_size(s) == n, "size %zu", rt_store_size(s));
    /* io_uring where the kernel allows it; where it refuses, the note says why */
    if (io) CHECK(!rt_store_uring(s), "io_uring with MBT_STORE_IO=%s", io);
    if (!rt_store_uring(s)) CHECK(strstr(rt_store_note(s), "worker thread") != NULL, "note: %s", rt_store_note(s));
    unsigned char *w = rt_store_alloc(n), *r = rt_store_alloc(n);
    fill(w, n, 3);
    /* unwritten parts read as zeros (the optimizer's moments start at 0) */
    CHECK(rt_store_read(s, 0, r, 64 * KB) == 0, "read: %s", rt_store_error(s));
    CHECK(rt_store_wait(s) == 0, "wait: %s", rt_store_error(s));
    int zeros = 1;
    for (size_t i = 0; i < 64 * KB; i++) zeros &= r[i] == 0;
    CHECK(zeros, "a fresh store does not read as zeros");
    for (int i = 0; i < 4; i++) CHECK(rt_store_write(s, i * n / 4, w + i * n / 4, n / 4) == 0, "write %d", i);
    CHECK(rt_store_wait(s) == 0, "wait: %s", rt_store_error(s));
    for (int i = 0; i < 16; i++) CHECK(rt_store_read(s, i * n / 16, r + i * n / 16, n / 16) == 0, "read %d", i);
    CHECK(rt_store_wait(s) == 0, "wait: %s", rt_store_error(s));
    CHECK(memcmp(w, r, n) == 0, "what was read differs from what was written");
    CHECK(strcmp(rt_store_error(s), "") == 0, "error after success: %s", rt_store_error(s));
    rt_store_close(s);
    CHECK(!exists(at("rt.store")), "close left the file");
    rt_store_free(w);
    rt_store_free(r);
}

static void round_trip_uring(void) { round_trip_with(NULL); }
static void round_trip_thread(void) { round_trip_with("thread"); }

/* 1000 writes of 4 KiB in flight at once (more than the ring's depth), in a scattered order, then
 * as many reads: each page holds its own pattern. */
static void many_outstanding_with(const char *io) {
    if (io) setenv("MBT_STORE_IO", io, 1);
    char err[512] = "";
    const int pages = 1000;
    size_t n = (size_t)pages * 4 * KB;
    RtStore *s = rt_store_open(dir, "many.store", n, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    unsigned char *w = rt_store_alloc(n), *r = rt_store_alloc(n);
    fill(w, n, 11);
    for (int k = 0; k < pages; k++) {
        int p = (k * 617) % pages; /* 617 is prime to 1000: every page once */
        CHECK(rt_store_write(s, (size_t)p * 4 * KB, w + (size_t)p * 4 * KB, 4 * KB) == 0, "write %d: %s", p, rt_store_error(s));
    }
    CHECK(rt_store_wait(s) == 0, "wait: %s", rt_store_error(s));
    for (int k = 0; k < pages; k++) {
        int p = (k * 389) % pages;
        CHECK(rt_store_read(s, (size_t)p * 4 * KB, r + (size_t)p * 4 * KB, 4 * KB) == 0, "read %d", p);
    }
    CHECK(rt_store_wait(s) == 0, "wait: %s", rt_store_error(s));
    CHECK(memcmp(w, r, n) == 0, "what was read differs from what was written");
    rt_store_close(s);
    rt_store_free(w);
    rt_store_free(r);
}

static void many_outstanding_uring(void) { many_outstanding_with(NULL); }
static void many_outstanding_thread(void) { many_outstanding_with("thread"); }

/* The disk fills: the file size limit is lowered to 256 KiB after the store (1 MiB) is open, so a
 * write of [192 KiB, 320 KiB) moves 64 KiB and then fails with EFBIG. A store bigger than the
 * limit fails at open (it is allocated in full there). */
static void disk_full_with(const char *io) {
    if (io) setenv("MBT_STORE_IO", io, 1);
    signal(SIGXFSZ, SIG_IGN);
    char err[512] = "";
    size_t n = 1024 * KB;
    RtStore *s = rt_store_open(dir, "full.store", n, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    struct rlimit lim = {256 * KB, 256 * KB};
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    unsigned char *w = rt_store_alloc(n);
    fill(w, n, 5);
    CHECK(rt_store_write(s, 0, w, 128 * KB) == 0, "a write under the limit");
    CHECK(rt_store_write(s, 192 * KB, w, 128 * KB) == 0, "queueing a write past the limit");
    CHECK(rt_store_wait(s) == -1, "a write past the file size limit succeeded");
    const char *e = rt_store_error(s);
    CHECK(strstr(e, at("full.store")) != NULL, "no file name: %s", e);
    CHECK(strstr(e, "[196608, 327680)") != NULL, "no byte range: %s", e);
    CHECK(strstr(e, "File too large") != NULL, "no reason: %s", e);
    /* sticky: the data is in an unknown state */
    CHECK(rt_store_write(s, 0, w, 4 * KB) == -1, "a write after a failure was queued");
    CHECK(rt_store_wait(s) == -1, "a wait after a failure succeeded");
    rt_store_close(s);
    CHECK(!exists(at("full.store")), "close left the file");

    s = rt_store_open(dir, "big.store", n, err, sizeof err);
    CHECK(s == NULL, "a store larger than the space left was opened");
    rt_store_close(s);
    CHECK(strstr(err, at("big.store")) && strstr(err, "1048576 bytes") && strstr(err, "File too large"), "open message: %s", err);
    CHECK(!exists(at("big.store")), "a failed open left its file");
    rt_store_free(w);
}

static void disk_full_uring(void) { disk_full_with(NULL); }
static void disk_full_thread(void) { disk_full_with("thread"); }

/* The file removed (its directory deleted) while the store is in use: the next wait says so. */
static void file_vanishes(void) {
    char err[512] = "";
    RtStore *s = rt_store_open(dir, "gone.store", 64 * KB, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    unsigned char *w = rt_store_alloc(64 * KB);
    CHECK(rt_store_write(s, 0, w, 64 * KB) == 0 && rt_store_wait(s) == 0, "first write: %s", rt_store_error(s));
    CHECK(unlink(at("gone.store")) == 0, "unlink");
    CHECK(rt_store_write(s, 0, w, 64 * KB) == 0, "queueing");
    CHECK(rt_store_wait(s) == -1, "a vanished file went unnoticed");
    const char *e = rt_store_error(s);
    CHECK(strstr(e, at("gone.store")) && strstr(e, "vanished") && strstr(e, "No such file or directory"), "message: %s", e);
    rt_store_close(s);
    rt_store_free(w);
}

static void directory_missing(void) {
    char err[512] = "";
    RtStore *s = rt_store_open(at("no-such-dir"), "x.store", 64 * KB, err, sizeof err);
    CHECK(s == NULL, "opened in a directory that does not exist");
    CHECK(strstr(err, at("no-such-dir")) && strstr(err, "No such file or directory"), "message: %s", err);
    s = rt_store_open(dir, "x.store", 1000, err, sizeof err);
    CHECK(s == NULL, "opened with a size that is not a multiple of 4096");
    CHECK(strstr(err, "1000 bytes") != NULL, "message: %s", err);
    s = rt_store_open(dir, "a/b", 4 * KB, err, sizeof err);
    CHECK(s == NULL, "opened with a name holding '/'");
}

/* Unaligned offsets, lengths and buffers, and ranges past the end, are refused at once, naming
 * what was wrong; the store stays usable. */
static void unaligned_refused(void) {
    char err[512] = "";
    RtStore *s = rt_store_open(dir, "align.store", 64 * KB, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    unsigned char *w = rt_store_alloc(64 * KB);
    CHECK(rt_store_write(s, 100, w, 4 * KB) == -1, "an unaligned offset was taken");
    CHECK(strstr(rt_store_error(s), "not aligned to 4096") != NULL, "message: %s", rt_store_error(s));
    CHECK(rt_store_write(s, 0, w, 100) == -1, "an unaligned length was taken");
    CHECK(rt_store_read(s, 0, w + 8, 4 * KB) == -1, "an unaligned buffer was taken");
    CHECK(rt_store_read(s, 60 * KB, w, 8 * KB) == -1, "a read past the end was taken");
    CHECK(strstr(rt_store_error(s), "[61440, 69632) is past its end (65536 bytes)") != NULL, "message: %s", rt_store_error(s));
    CHECK(rt_store_write(s, 0, w, 4 * KB) == 0 && rt_store_wait(s) == 0, "the store is unusable after a refusal: %s",
          rt_store_error(s));
    CHECK(rt_store_align(1) == 4096 && rt_store_align(4096) == 4096 && rt_store_align(4097) == 8192, "rt_store_align");
    CHECK(((uintptr_t)w % 4096) == 0, "rt_store_alloc is not aligned");
    rt_store_close(s);
    rt_store_free(w);
}

/* tmpfs (/dev/shm): O_DIRECT or, where the kernel refuses it there, buffered I/O with a note. */
static void tmpfs_works(void) {
    if (!exists("/dev/shm")) return;
    char err[512] = "";
    RtStore *s = rt_store_open("/dev/shm", "mbt-test-store.store", 64 * KB, err, sizeof err);
    CHECK(s != NULL, "open: %s", err);
    if (!s) return;
    if (!rt_store_direct(s)) CHECK(strstr(rt_store_note(s), "O_DIRECT") != NULL, "note: %s", rt_store_note(s));
    unsigned char *w = rt_store_alloc(64 * KB), *r = rt_store_alloc(64 * KB);
    fill(w, 64 * KB, 9);
    CHECK(rt_store_write(s, 0, w, 64 * KB) == 0 && rt_store_wait(s) == 0, "write: %s", rt_store_error(s));
    CHECK(rt_store_read(s, 0, r, 64 * KB) == 0 && rt_store_wait(s) == 0, "read: %s", rt_store_error(s));
    CHECK(memcmp(w, r, 64 * KB) == 0, "round trip on tmpfs");
    rt_store_close(s);
    rt_store_free(w);
    rt_store_free(r);
}

int main(void) {
    dir_make_tagged("store");
    RUN(round_trip_uring);
    RUN(round_trip_thread);
    RUN(many_outstanding_uring);
    RUN(many_outstanding_thread);
    RUN(disk_full_uring);
    RUN(disk_full_thread);
    RUN(file_vanishes);
    RUN(directory_missing);
    RUN(unaligned_refused);
    RUN(tmpfs_works);
    dir_remove();
    return unit_finish();
}
