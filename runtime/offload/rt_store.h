/* rt_store.h - the NVMe store: one file of fixed size in a directory, read and written
 * asynchronously in 4096-byte aligned pieces (runtime/offload/store.c; docs/memory.md, "The NVMe
 * store").
 *
 * Pipeline position: under the train loop (runtime/cli/train.c), which keeps the optimizer's
 * per-parameter state in a store when a program says `offload { optimizer = nvme }`, and under
 * activation offload. The file is opened with O_DIRECT where the file system supports it (a tmpfs
 * does not: then buffered I/O) and is allocated in full when it is opened, so that a disk too small
 * for it is an error at the start of a run, not in its middle. Reads and writes go through io_uring
 * (liburing); where the kernel or a seccomp filter refuses io_uring, one worker thread does
 * pread/pwrite instead. Either way a write or read only queues the request: rt_store_wait waits
 * for everything queued and says whether all of it succeeded.
 *
 * As the rest of the runtime, the store never prints: what a user should know about how it runs
 * (buffered I/O, the worker thread) is in rt_store_note for the caller's log. */
#ifndef MBT_RT_STORE_H
#define MBT_RT_STORE_H

#include <stddef.h>

#define RT_STORE_ALIGN 4096 /* offsets, lengths and buffers of every request are multiples of this */

typedef struct RtStore RtStore;

size_t rt_store_align(size_t n); /* n rounded up to a multiple of RT_STORE_ALIGN */
void *rt_store_alloc(size_t n);  /* zeroed memory aligned to RT_STORE_ALIGN (n rounded up), or NULL */
void rt_store_free(void *p);     /* frees what rt_store_alloc returned (NULL is fine) */

/* Creates (or truncates) DIR/NAME of BYTES bytes (a multiple of RT_STORE_ALIGN), allocates it in
 * full and readies the I/O. NULL on failure, with a message naming the file in err. The environment
 * variable MBT_STORE_IO=thread picks the worker thread even where io_uring works (for tests). */
RtStore *rt_store_open(const char *dir, const char *name, size_t bytes, char *err, size_t errlen);
/* Queue a write of buf[0, len) at byte off, or a read into it. buf must stay untouched (write) or
 * unread (read) until rt_store_wait returns. -1 when an argument is unaligned or out of the file
 * (rt_store_error says which), or when an earlier request failed; 0 when queued. */
int rt_store_write(RtStore *s, size_t off, const void *buf, size_t len);
int rt_store_read(RtStore *s, size_t off, void *buf, size_t len);
/* Waits for every queued request. 0 when all succeeded; -1 when any failed (a short read or
 * write, ENOSPC, EIO ...) or the file has vanished from its directory: rt_store_error names the
 * file, the byte range and the reason. A failure is sticky: later calls fail too. */
int rt_store_wait(RtStore *s);
const char *rt_store_error(const RtStore *s); /* the last failure's message ("" when none) */
const char *rt_store_note(const RtStore *s);  /* how it runs, for the log: "" when O_DIRECT on io_uring */
const char *rt_store_path(const RtStore *s);  /* DIR/NAME */
size_t rt_store_size(const RtStore *s);       /* the file's size in bytes */
int rt_store_direct(const RtStore *s);        /* 1 when the file is open with O_DIRECT */
int rt_store_uring(const RtStore *s);         /* 1 when requests go through io_uring, 0: a worker thread */
/* Waits for what is queued, closes and removes the file, frees the store (NULL is fine). */
void rt_store_close(RtStore *s);

#endif
