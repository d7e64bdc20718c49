/* fake_nccl.c - a stand-in for NCCL for the emulated GPU (tests/cudaemu/fake_cuda.c), so that the
 * data-parallel ranks' GPU transport (runtime/comm/comm_nccl.c) runs in make test without a GPU:
 * the runtime opens it as NCCL when MBT_LIBNCCL names it (build/tests/libmbt_fake_nccl.so).
 *
 * The emulated GPU's device memory is host memory and its compute stream runs every call at once,
 * so a group's sends and receives are carried out when ncclGroupEnd is called (a group on one of
 * its second streams - the data-parallel buckets' communication stream - is queued there with the
 * fake driver's cuLaunchHostFunc and carried out when that stream's work runs): each send on a thread of
 * its own (so that no order of sends and receives among the ranks can deadlock), each receive on
 * the caller's thread, over a Unix socket between every two ranks. The sockets live in a directory
 * named by the unique id (rank 0 makes it; every rank finds it through the id the runtime
 * broadcasts). What it checks: that comm_nccl.c pairs every send with the peer's receive of the
 * same count (a mismatch is an error here, as NCCL would hang), passes device pointers and ranks
 * right, and waits for a non-blocking communicator (ncclCommInitRankConfig and ncclGroupEnd
 * answer ncclInProgress once, ncclCommGetAsyncError then ncclSuccess). What it cannot: NCCL's own
 * transports, its asynchrony on a real stream, its speed.
 *
 * MBT_FAKE_NCCL_FAIL=RANK: that rank's ncclGroupEnd fails (the error path); MBT_FAKE_NCCL_HANG=RANK:
 * that rank's communicator stays in progress forever (the timeout path). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3, ncclInvalidArgument = 4, ncclInProgress = 7 };
typedef struct {
    char internal[128];
} ncclUniqueId;

#define FAKE_MAX_RANKS 64
#define FAKE_MAX_OPS 256

typedef struct ncclComm {
    int rank, size, hang;
    int err;                /* a group run later on a second stream failed: ncclCommGetAsyncError says so from then on */
    int later;              /* groups queued on a second stream and not yet run: they hold the communicator */
    int dead;               /* destroyed or aborted while later > 0: the last of them frees it */
    int fd[FAKE_MAX_RANKS]; /* the socket to each peer (-1 for this rank) */
    char dir[64];           /* the id's directory: "/tmp/mbt-fake-nccl-XXXXXX" */
    int pending;            /* ncclInProgress to report once before success */
} FakeComm;

typedef struct {
    int send; /* 1 send, 0 receive */
    void *buf;
    size_t bytes;
    int peer;
    FakeComm *comm;
    void *stream;
} FakeOp;

static struct {
    int depth, n;
    FakeOp op[FAKE_MAX_OPS];
    ncclResult_t err; /* a failed call inside the group */
} group;

static int fake_env_rank(const char *name) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : -1;
}

ncclResult_t ncclGetVersion(int *v) {
    *v = 29900; /* 2.99.0: plainly not a real NCCL in messages */
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (fake NCCL: a peer's socket failed)";
    case ncclInternalError: return "internal error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    char dir[] = "/tmp/mbt-fake-nccl-XXXXXX";
    if (!mkdtemp(dir)) return ncclSystemError;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s", dir);
    return ncclSuccess;
}

/* A peer that never sends must not hang a test: every read gives up after 120 s. */
static void fake_timeout(int fd) {
    struct timeval tv = {120, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static void fake_sock_path(struct sockaddr_un *a, const char *dir, int rank) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    snprintf(a->sun_path, sizeof a->sun_path, "%.63s/rank%d", dir, rank);
}

static int fake_write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

static int fake_read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n > 0) {
        ssize_t r = recv(fd, c, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r, n -= (size_t)r;
    }
    return 0;
}

/* The full mesh: rank r listens; it connects to every lower rank (retrying until that rank's
 * socket exists, up to 60 s) and accepts every higher one, which says who it is. */
ncclResult_t ncclCommInitRankConfig(FakeComm **out, int nranks, ncclUniqueId id, int rank, void *config) {
    (void)config;
    if (nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    FakeComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank, c->size = nranks, c->pending = 1;
    c->hang = fake_env_rank("MBT_FAKE_NCCL_HANG") == rank;
    snprintf(c->dir, sizeof c->dir, "%.63s", id.internal);
    for (int p = 0; p < nranks; p++) c->fd[p] = -1;
    struct sockaddr_un a;
    fake_sock_path(&a, c->dir, rank);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, FAKE_MAX_RANKS)) goto fail;
    for (int p = 0; p < rank; p++) {
        struct sockaddr_un pa;
        fake_sock_path(&pa, c->dir, p);
        int fd = -1;
        for (int tries = 0; tries < 60000; tries++) {
            fd = socket(AF_UNIX, SOCK_STREAM, 0);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&pa, sizeof pa) == 0) break;
            if (fd >= 0) close(fd);
            fd = -1;
            usleep(1000);
        }
        if (fd < 0 || fake_write_all(fd, &rank, sizeof rank)) goto fail;
        fake_timeout(fd);
        c->fd[p] = fd;
    }
    for (int k = rank + 1; k < nranks; k++) {
        int fd = accept(lfd, NULL, NULL), who = -1;
        if (fd < 0 || fake_read_all(fd, &who, sizeof who) || who <= rank || who >= nranks || c->fd[who] >= 0) goto fail;
        fake_timeout(fd);
        c->fd[who] = fd;
    }
    close(lfd);
    unlink(a.sun_path);
    if (rank == nranks - 1 || nranks == 1) rmdir(c->dir); /* (fails harmlessly while others' sockets remain) */
    *out = c;
    return ncclInProgress; /* non-blocking, as a communicator with config.blocking = 0 answers */
fail:
    if (lfd >= 0) close(lfd);
    for (int p = 0; p < nranks; p++)
        if (c->fd[p] >= 0) close(c->fd[p]);
    free(c);
    return ncclSystemError;
}

ncclResult_t ncclCommGetAsyncError(FakeComm *c, ncclResult_t *state) {
    if (!c) return ncclInvalidArgument;
    if (c->hang) {
        *state = ncclInProgress;
        return ncclSuccess;
    }
    *state = c->err ? c->err : c->pending ? ncclInProgress : ncclSuccess;
    c->pending = 0;
    return ncclSuccess;
}

static void fake_comm_free(FakeComm *c) {
    if (!c) return;
    for (int p = 0; p < c->size; p++) {
        if (c->fd[p] >= 0) close(c->fd[p]);
        c->fd[p] = -1; /* a group still queued on a second stream then fails, as an aborted NCCL's does */
    }
    if (c->later > 0) c->dead = 1;
    else free(c);
}

ncclResult_t ncclCommAbort(FakeComm *c) {
    fake_comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(FakeComm *c) {
    fake_comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    if (group.depth++ == 0) group.n = 0, group.err = ncclSuccess;
    return ncclSuccess;
}

static ncclResult_t fake_queue(int send, void *buf, size_t count, int type, int peer, FakeComm *c) {
    if (type != 7 /* ncclFloat32 */) return ncclInvalidArgument;
    if (!c || peer < 0 || peer >= c->size || peer == c->rank || group.depth == 0 || group.n >= FAKE_MAX_OPS) {
        group.err = ncclInvalidArgument;
        return ncclInvalidArgument;
    }
    group.op[group.n++] = (FakeOp){send, buf, count * 4, peer, c, NULL};
    return ncclSuccess;
}

static ncclResult_t fake_queue_on(int send, void *buf, size_t count, int type, int peer, FakeComm *c, void *stream) {
    ncclResult_t rc = fake_queue(send, buf, count, type, peer, c);
    if (rc == ncclSuccess) group.op[group.n - 1].stream = stream;
    return rc;
}

ncclResult_t ncclSend(const void *buf, size_t count, int type, int peer, FakeComm *c, void *stream) {
    return fake_queue_on(1, (void *)buf, count, type, peer, c, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, int type, int peer, FakeComm *c, void *stream) {
    return fake_queue_on(0, buf, count, type, peer, c, stream);
}

/* The emulated GPU's second streams (tests/cudaemu/fake_cuda.c): a group on one runs when that
 * stream's work runs, as late as a GPU could run it (cuLaunchHostFunc of the fake driver, found
 * through MBT_LIBCUDA, already loaded); a group on the compute stream, or without the fake
 * driver, runs at ncclGroupEnd. */
static struct {
    int tried;
    int (*is_queue)(void *stream);
    int (*host_func)(void *stream, void (*fn)(void *), void *arg);
} drv;

static void fake_driver(void) {
    if (drv.tried) return;
    drv.tried = 1;
    const char *path = getenv("MBT_LIBCUDA");
    void *h = path && *path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!h) return;
    *(void **)&drv.is_queue = dlsym(h, "fake_stream_is_queue");
    *(void **)&drv.host_func = dlsym(h, "cuLaunchHostFunc");
    if (!drv.is_queue || !drv.host_func) drv.is_queue = NULL, drv.host_func = NULL;
}

/* A send: its byte count first, so that the receiver sees a mismatch instead of a hang. */
static void *fake_sender(void *arg) {
    FakeOp *o = arg;
    uint64_t n = o->bytes;
    int bad = fake_write_all(o->comm->fd[o->peer], &n, sizeof n) || fake_write_all(o->comm->fd[o->peer], o->buf, o->bytes);
    return bad ? (void *)1 : NULL;
}

/* A group's sends and receives carried out (op[0, n)). */
static ncclResult_t fake_group_run(FakeOp *op, int n) {
    pthread_t th[FAKE_MAX_OPS];
    int started[FAKE_MAX_OPS] = {0};
    ncclResult_t rc = ncclSuccess;
    for (int i = 0; i < n; i++)
        if (op[i].send) started[i] = pthread_create(&th[i], NULL, fake_sender, &op[i]) == 0;
    for (int i = 0; i < n && rc == ncclSuccess; i++) {
        FakeOp *o = &op[i];
        if (o->send) continue;
        uint64_t n = 0;
        if (fake_read_all(o->comm->fd[o->peer], &n, sizeof n)) rc = ncclSystemError;
        else if (n != o->bytes) {
            fprintf(stderr, "fake NCCL: rank %d receives %zu bytes from rank %d, which sends %llu\n", o->comm->rank, o->bytes,
                    o->peer, (unsigned long long)n);
            rc = ncclInvalidArgument;
        } else if (fake_read_all(o->comm->fd[o->peer], o->buf, o->bytes)) rc = ncclSystemError;
    }
    for (int i = 0; i < n; i++) {
        if (!started[i]) {
            if (op[i].send) rc = ncclSystemError;
            continue;
        }
        void *bad = NULL;
        pthread_join(th[i], &bad);
        if (bad && rc == ncclSuccess) rc = ncclSystemError;
    }
    return rc;
}

typedef struct {
    int n;
    FakeOp op[];
} FakeLater;

/* A group run by the second stream it was queued on; a failure is the communicator's from then on. */
static void fake_group_later(void *arg) {
    FakeLater *l = arg;
    FakeComm *c = l->op[0].comm;
    ncclResult_t rc = c->dead ? ncclSystemError : fake_group_run(l->op, l->n);
    if (rc != ncclSuccess && !c->err) c->err = rc;
    free(l);
    if (--c->later == 0 && c->dead) free(c);
}

ncclResult_t ncclGroupEnd(void) {
    if (group.depth == 0) return ncclInvalidArgument;
    if (--group.depth > 0) return ncclSuccess;
    if (group.err != ncclSuccess) return group.err;
    FakeComm *c = group.n ? group.op[0].comm : NULL;
    if (c && fake_env_rank("MBT_FAKE_NCCL_FAIL") == c->rank) return ncclSystemError;
    ncclResult_t rc = ncclSuccess;
    fake_driver();
    if (c && drv.is_queue && drv.is_queue(group.op[0].stream)) {
        FakeLater *l = malloc(sizeof *l + (size_t)group.n * sizeof l->op[0]);
        if (!l) return ncclSystemError;
        l->n = group.n;
        memcpy(l->op, group.op, (size_t)group.n * sizeof l->op[0]);
        c->later++;
        if (drv.host_func(group.op[0].stream, fake_group_later, l) != 0) {
            c->later--;
            free(l);
            rc = ncclSystemError;
        }
    } else rc = fake_group_run(group.op, group.n);
    group.n = 0;
    if (rc == ncclSuccess && c) c->pending = 1; /* the group answers in progress, as a non-blocking one does */
    return rc == ncclSuccess ? ncclInProgress : rc;
}
