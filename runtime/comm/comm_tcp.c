/* comm_tcp.c - the tcp backend (comm.h): torchrun's environment and plain sockets, so that a GPU
 * node without MPI can run several ranks (and, later, bootstrap NCCL through it).
 *
 * Rendezvous (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; docs/parallel.md):
 *   rank 0 listens at MASTER_PORT on every IPv4 address; every other rank opens a listening
 *   socket of its own (any port), connects to MASTER_ADDR:MASTER_PORT (retrying until the
 *   timeout: rank 0 may start later) and says hello (its rank, the world's size as it sees it,
 *   its port). Rank 0 checks the hellos (ranks in range, each once, the same world size), and
 *   sends every rank the table of addresses: each rank's port and the address rank 0 saw it
 *   connect from. Rank j then connects to every rank 0 < i < j and accepts the connections of
 *   the ranks above it. The result is a full mesh: one socket per pair of ranks.
 *
 * Why a full mesh and not a star through rank 0: the gradient exchange is all-to-all, and a star
 * would send every byte through rank 0 twice, making its link the bottleneck (size - 1 times the
 * traffic of a mesh). A mesh moves each shard once, as the MPI backend does; its cost is
 * size x (size - 1) / 2 sockets, nothing for the ranks of one node or a few nodes.
 *
 * Collectives: every rank sends each peer one message (a 24-byte header: magic, collective,
 * call number, payload bytes; then the payload) and receives one from each, all at once on
 * non-blocking sockets driven by poll() with the world's deadline. The header catches ranks that
 * called different collectives (a message naming both), and a peer that closed its socket (it
 * exited, crashed or was killed) is an error naming that rank as soon as this rank reads from
 * it. rt_comm_abort closes every socket, so the peers' calls fail at once. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm_internal.h"

#define RT_TCP_MAGIC 0x6d627463u /* "mbtc" */

typedef struct RtTcpHdr {
    uint32_t magic, op;
    uint64_t seq, bytes;
} RtTcpHdr;

/* One peer's part of a collective: what to send it and where its message goes. */
typedef struct RtTcpXfer {
    const char *send;
    char *recv;
    int64_t send_len, recv_len; /* payload bytes; -1: nothing that way */
    int64_t sent, got;          /* header included */
    RtTcpHdr sh, rh;
} RtTcpXfer;

typedef struct RtTcp {
    int *fd; /* per rank; -1 for this rank */
    RtTcpXfer *x;
    struct pollfd *pfd;
    int *pfd_rank;
    uint64_t seq; /* collectives called so far */
} RtTcp;

/* ---- the collectives ------------------------------------------------------------------------- */

static RtStatus rt_tcp_closed(RtComm *c, int p, RtCommOp op, int errnum, RtError *err) {
    if (errnum)
        return rt_fail(
            err, RT_ERR_IO,
            "collectives (tcp): rank %d of %d lost its connection to rank %d in %s: %s (rank %d exited, crashed or was "
            "killed)",
            c->rank, c->size, p, rt_comm_op_name(op), strerror(errnum), p);
    return rt_fail(
        err, RT_ERR_IO,
        "collectives (tcp): rank %d closed its connection while rank %d of %d waited in %s (rank %d exited, crashed or "
        "was killed)",
        p, c->rank, c->size, rt_comm_op_name(op), p);
}

/* Progress on peer p's sending side; 1 when done. */
static RtStatus rt_tcp_send(RtComm *c, int p, RtCommOp op, RtError *err) {
    RtTcp *t = c->impl;
    RtTcpXfer *x = &t->x[p];
    while (x->sent < (int64_t)sizeof x->sh + x->send_len) {
        const char *src;
        int64_t left;
        if (x->sent < (int64_t)sizeof x->sh) src = (const char *)&x->sh + x->sent, left = (int64_t)sizeof x->sh - x->sent;
        else src = x->send + (x->sent - (int64_t)sizeof x->sh), left = x->send_len - (x->sent - (int64_t)sizeof x->sh);
        if (left > (INT64_C(1) << 30)) left = INT64_C(1) << 30;
        ssize_t k = send(t->fd[p], src, (size_t)left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return RT_OK;
            return rt_tcp_closed(c, p, op, errno, err);
        }
        x->sent += k;
    }
    return RT_OK;
}

static RtStatus rt_tcp_recv(RtComm *c, int p, RtCommOp op, RtError *err) {
    RtTcp *t = c->impl;
    RtTcpXfer *x = &t->x[p];
    const int64_t H = (int64_t)sizeof x->rh;
    while (x->got < H + x->recv_len) {
        char *dst;
        int64_t left;
        if (x->got < H) dst = (char *)&x->rh + x->got, left = H - x->got;
        else dst = x->recv + (x->got - H), left = x->recv_len - (x->got - H);
        if (left > (INT64_C(1) << 30)) left = INT64_C(1) << 30;
        ssize_t k = recv(t->fd[p], dst, (size_t)left, MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return RT_OK;
            return rt_tcp_closed(c, p, op, errno, err);
        }
        if (k == 0) return rt_tcp_closed(c, p, op, 0, err);
        x->got += k;
        if (x->got == H) { /* the header: the same collective, call and size as this rank's? */
            const RtTcpHdr *h = &x->rh;
            if (h->magic != RT_TCP_MAGIC)
                return rt_fail(err, RT_ERR_IO, "collectives (tcp): rank %d sent rank %d a malformed message in %s", p, c->rank,
                               rt_comm_op_name(op));
            if (h->op != (uint32_t)op || h->seq != t->seq || h->bytes != (uint64_t)x->recv_len)
                return rt_fail(err, RT_ERR_IO,
                               "collectives (tcp): rank %d is in %s (call %llu, %llu bytes) while rank %d is in %s (call %llu, "
                               "%lld bytes): the ranks called different collectives",
                               p, rt_comm_op_name((RtCommOp)h->op), (unsigned long long)h->seq, (unsigned long long)h->bytes,
                               c->rank, rt_comm_op_name(op), (unsigned long long)t->seq, (long long)x->recv_len);
        }
    }
    return RT_OK;
}

/* Runs the transfers set up in t->x (one per peer) until all are done or the deadline passes. */
static RtStatus rt_tcp_run(RtComm *c, RtCommOp op, RtError *err) {
    RtTcp *t = c->impl;
    t->seq++;
    for (int p = 0; p < c->size; p++) {
        RtTcpXfer *x = &t->x[p];
        x->sent = x->got = 0;
        x->sh = (RtTcpHdr){RT_TCP_MAGIC, (uint32_t)op, t->seq, x->send_len > 0 ? (uint64_t)x->send_len : 0};
    }
    double t0 = rt_comm_now(), deadline = t0 + c->timeout;
    for (;;) {
        int n = 0;
        for (int p = 0; p < c->size; p++) {
            RtTcpXfer *x = &t->x[p];
            if (p == c->rank) continue;
            short ev = 0;
            if (x->send_len >= 0 && x->sent < (int64_t)sizeof x->sh + x->send_len) ev |= POLLOUT;
            if (x->recv_len >= 0 && x->got < (int64_t)sizeof x->rh + x->recv_len) ev |= POLLIN;
            if (!ev) continue;
            t->pfd[n] = (struct pollfd){t->fd[p], ev, 0};
            t->pfd_rank[n++] = p;
        }
        if (n == 0) return RT_OK;
        double now = rt_comm_now();
        if (now > deadline) {
            int p = t->pfd_rank[0];
            RtTcpXfer *x = &t->x[p];
            return rt_fail(
                err, RT_ERR_IO,
                "collectives (tcp): rank %d of %d timed out after %.3g s waiting in %s for rank %d (%s; a rank stopped, "
                "is stuck or is much slower; MBT_COMM_TIMEOUT sets the wait)",
                c->rank, c->size, now - t0, rt_comm_op_name(op), p,
                x->recv_len >= 0 && x->got < (int64_t)sizeof x->rh + x->recv_len
                    ? (x->got ? "its message came in part" : "nothing came from it")
                    : "it is not taking what this rank sends");
        }
        int ms = (int)((deadline - now) * 1e3) + 1;
        int k = poll(t->pfd, (nfds_t)n, ms);
        if (k < 0) {
            if (errno == EINTR) continue;
            return rt_fail_errno(err, errno, "collectives (tcp): poll in %s", rt_comm_op_name(op));
        }
        for (int i = 0; i < n; i++) {
            short re = t->pfd[i].revents;
            if (!re) continue;
            int p = t->pfd_rank[i];
            RtStatus st = RT_OK;
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                if (t->pfd[i].events & POLLIN) st = rt_tcp_recv(c, p, op, err);
                else if (re & (POLLHUP | POLLERR)) st = rt_tcp_send(c, p, op, err); /* reports the error */
            }
            if (st == RT_OK && (re & POLLOUT)) st = rt_tcp_send(c, p, op, err);
            if (st != RT_OK) return st;
        }
    }
}

static void rt_tcp_none(RtComm *c) {
    RtTcp *t = c->impl;
    for (int p = 0; p < c->size; p++) t->x[p].send_len = t->x[p].recv_len = -1;
}

static RtStatus rt_tcp_exchange(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err) {
    RtTcp *t = c->impl;
    int r = c->rank;
    int64_t len = off[r + 1] - off[r];
    for (int p = 0; p < c->size; p++) {
        RtTcpXfer *x = &t->x[p];
        x->send = (const char *)(mine + off[p]);
        x->send_len = (int64_t)sizeof(float) * (off[p + 1] - off[p]);
        x->recv = (char *)(got + len * p);
        x->recv_len = (int64_t)sizeof(float) * len;
    }
    if (len > 0) memcpy(got + len * r, mine + off[r], (size_t)len * sizeof *got);
    return rt_tcp_run(c, RT_COMM_EXCHANGE, err);
}

static RtStatus rt_tcp_gather_shards(RtComm *c, float *v, const int64_t *off, RtError *err) {
    RtTcp *t = c->impl;
    int r = c->rank;
    for (int p = 0; p < c->size; p++) {
        RtTcpXfer *x = &t->x[p];
        x->send = (const char *)(v + off[r]);
        x->send_len = (int64_t)sizeof(float) * (off[r + 1] - off[r]);
        x->recv = (char *)(v + off[p]);
        x->recv_len = (int64_t)sizeof(float) * (off[p + 1] - off[p]);
    }
    return rt_tcp_run(c, RT_COMM_GATHER_SHARDS, err);
}

static RtStatus rt_tcp_gather_f64(RtComm *c, const double *mine, int64_t n, double *all, RtError *err) {
    RtTcp *t = c->impl;
    for (int p = 0; p < c->size; p++) {
        RtTcpXfer *x = &t->x[p];
        x->send = (const char *)mine;
        x->send_len = (int64_t)sizeof(double) * n;
        x->recv = (char *)(all + n * p);
        x->recv_len = (int64_t)sizeof(double) * n;
    }
    if (n > 0) memcpy(all + n * c->rank, mine, (size_t)n * sizeof *all);
    return rt_tcp_run(c, RT_COMM_GATHER_F64, err);
}

static RtStatus rt_tcp_broadcast(RtComm *c, void *buf, int64_t bytes, int root, RtError *err) {
    RtTcp *t = c->impl;
    rt_tcp_none(c);
    for (int p = 0; p < c->size; p++) {
        RtTcpXfer *x = &t->x[p];
        if (c->rank == root) x->send = buf, x->send_len = bytes;
        else if (p == root) x->recv = buf, x->recv_len = bytes;
    }
    return rt_tcp_run(c, RT_COMM_BROADCAST, err);
}

static RtStatus rt_tcp_barrier(RtComm *c, RtError *err) {
    RtTcp *t = c->impl;
    for (int p = 0; p < c->size; p++) t->x[p].send_len = t->x[p].recv_len = 0; /* a header each way */
    return rt_tcp_run(c, RT_COMM_BARRIER, err);
}

static void rt_tcp_free(RtComm *c) {
    RtTcp *t = c->impl;
    if (!t) return;
    for (int p = 0; t->fd && p < c->size; p++)
        if (t->fd[p] >= 0) close(t->fd[p]);
    free(t->fd);
    free(t->x);
    free(t->pfd);
    free(t->pfd_rank);
    free(t);
    c->impl = NULL;
}

static void rt_tcp_abort(RtComm *c, int status) {
    (void)status;
    RtTcp *t = c->impl;
    /* a reset, not a polite end: the peers' reads fail now, whatever they were waiting for */
    for (int p = 0; t && p < c->size; p++)
        if (t->fd[p] >= 0) {
            struct linger l = {1, 0};
            setsockopt(t->fd[p], SOL_SOCKET, SO_LINGER, &l, sizeof l);
            close(t->fd[p]);
            t->fd[p] = -1;
        }
}

static const RtCommOps rt_tcp_ops = {rt_tcp_exchange, rt_tcp_gather_shards, rt_tcp_gather_f64, rt_tcp_broadcast,
                                     rt_tcp_barrier,  rt_tcp_free,          rt_tcp_abort};

/* ---- the rendezvous -------------------------------------------------------------------------- */

typedef struct RtTcpHello {
    uint32_t magic, rank, size, port;
} RtTcpHello;

typedef struct RtTcpAddr {
    uint32_t ip; /* network order */
    uint32_t port;
} RtTcpAddr;

/* Reads or writes exactly n bytes on a blocking-free socket before the deadline. */
static RtStatus rt_tcp_io(int fd, void *buf, size_t n, int writing, double deadline, const char *what, RtError *err) {
    size_t done = 0;
    while (done < n) {
        double left = deadline - rt_comm_now();
        if (left <= 0) return rt_fail(err, RT_ERR_IO, "collectives (tcp): timed out %s", what);
        struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
        int k = poll(&pf, 1, (int)(left * 1e3) + 1);
        if (k < 0 && errno != EINTR) return rt_fail_errno(err, errno, "collectives (tcp): poll %s", what);
        if (k <= 0) continue;
        ssize_t m = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
        if (m < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return rt_fail_errno(err, errno, "collectives (tcp): %s", what);
        }
        if (m == 0) return rt_fail(err, RT_ERR_IO, "collectives (tcp): the peer closed the connection %s", what);
        done += (size_t)m;
    }
    return RT_OK;
}

static int rt_tcp_socket(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* A listening socket on every IPv4 address at port (0: any); *port gets the one bound. */
static RtStatus rt_tcp_listen(int *out, int *port, RtError *err) {
    int fd = rt_tcp_socket();
    if (fd < 0) return rt_fail_errno(err, errno, "collectives (tcp): socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return rt_fail_errno(err, e, "collectives (tcp): cannot listen at port %d", *port);
    }
    *port = ntohs(a.sin_port);
    *out = fd;
    return RT_OK;
}

/* Connects to a (retrying refused connections: the listener may not be up yet) before the deadline. */
static RtStatus rt_tcp_connect(const struct sockaddr_in *a, double deadline, int *out, const char *whom, RtError *err) {
    int last = ETIMEDOUT;
    while (rt_comm_now() < deadline) {
        int fd = rt_tcp_socket();
        if (fd < 0) return rt_fail_errno(err, errno, "collectives (tcp): socket");
        int rc = connect(fd, (const struct sockaddr *)a, sizeof *a);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pf = {fd, POLLOUT, 0};
            double left = deadline - rt_comm_now();
            int k = poll(&pf, 1, left > 0 ? (int)(left * 1e3) + 1 : 0);
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (k > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc == 0) {
            *out = fd;
            return RT_OK;
        }
        last = errno;
        close(fd);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    return rt_fail(err, RT_ERR_IO, "collectives (tcp): cannot connect to %s at %s:%d before the timeout: %s", whom, ip,
                   ntohs(a->sin_port), strerror(last));
}

/* Accepts one connection and reads its hello, before the deadline. */
static RtStatus rt_tcp_accept(int lfd, double deadline, int *out, RtTcpHello *h, struct sockaddr_in *from, const char *what,
                              RtError *err) {
    for (;;) {
        double left = deadline - rt_comm_now();
        if (left <= 0) return rt_fail(err, RT_ERR_IO, "collectives (tcp): timed out %s", what);
        struct pollfd pf = {lfd, POLLIN, 0};
        int k = poll(&pf, 1, (int)(left * 1e3) + 1);
        if (k < 0 && errno != EINTR) return rt_fail_errno(err, errno, "collectives (tcp): poll %s", what);
        if (k <= 0) continue;
        socklen_t len = sizeof *from;
        int fd = accept4(lfd, (struct sockaddr *)from, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return rt_fail_errno(err, errno, "collectives (tcp): accept %s", what);
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        RtError e2;
        /* a connection that is not a rank (a port scanner, a stale client) is dropped */
        if (rt_tcp_io(fd, h, sizeof *h, 0, deadline, what, &e2) != RT_OK || h->magic != RT_TCP_MAGIC) {
            close(fd);
            continue;
        }
        *out = fd;
        return RT_OK;
    }
}

static RtStatus rt_env_int(const RtTcpVars *vars, const char *name, long lo, long hi, long *out, RtError *err) {
    const char *v = getenv(name);
    if (!v || !*v)
        return rt_fail(err, RT_ERR_ARG, "collectives (tcp): %s is not set (%s sets %s, %s, MASTER_ADDR and MASTER_PORT)", name,
                       vars->who, vars->rank, vars->size);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        return rt_fail(err, RT_ERR_ARG, "collectives (tcp): %s is '%.40s': it must be a whole number from %ld to %ld", name, v,
                       lo, hi);
    *out = x;
    return RT_OK;
}

static RtStatus rt_tcp_rendezvous(RtComm *c, const char *host, int mport, RtError *err) {
    RtTcp *t = c->impl;
    int P = c->size, r = c->rank;
    double deadline = rt_comm_now() + c->timeout;
    char what[160];
    int lfd = -1, port = r == 0 ? mport : 0;
    RtStatus st = RT_OK;
    RtTcpAddr *table = calloc((size_t)P, sizeof *table);
    if (!table) return rt_fail(err, RT_ERR_NOMEM, "collectives (tcp): out of memory");
    if (r == 0 || r < P - 1) {
        st = rt_tcp_listen(&lfd, &port, err);
        if (st != RT_OK && r == 0)
            st = rt_error_context(err, "rank 0 listens at MASTER_PORT %d (is another run using it?)", mport);
    }
    if (st == RT_OK && r == 0) {
        /* the hellos of ranks 1 .. P-1, then the table to each */
        for (int i = 1; i < P && st == RT_OK; i++) {
            RtTcpHello h;
            struct sockaddr_in from;
            int fd = -1;
            snprintf(what, sizeof what, "waiting at port %d for the other ranks (%d of %d came)", mport, i - 1, P - 1);
            st = rt_tcp_accept(lfd, deadline, &fd, &h, &from, what, err);
            if (st != RT_OK) break;
            if (h.size != (uint32_t)P)
                st = rt_fail(err, RT_ERR_ARG, "collectives (tcp): rank %u says WORLD_SIZE is %u, rank 0 says %d", h.rank, h.size,
                             P);
            else if (h.rank < 1 || h.rank >= (uint32_t)P || t->fd[h.rank] >= 0)
                st = rt_fail(err, RT_ERR_ARG, "collectives (tcp): two processes say they are rank %u (RANK must differ)", h.rank);
            if (st != RT_OK) {
                close(fd);
                break;
            }
            t->fd[h.rank] = fd;
            table[h.rank] = (RtTcpAddr){from.sin_addr.s_addr, h.port};
        }
        for (int i = 1; i < P && st == RT_OK; i++) {
            snprintf(what, sizeof what, "sending rank %d the table of addresses", i);
            st = rt_tcp_io(t->fd[i], table, (size_t)P * sizeof *table, 1, deadline, what, err);
        }
    } else if (st == RT_OK) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        int gai = getaddrinfo(host, NULL, &hints, &ai);
        if (gai != 0 || !ai) {
            st = rt_fail(err, RT_ERR_ARG, "collectives (tcp): MASTER_ADDR '%.100s' has no IPv4 address: %s", host,
                         gai ? gai_strerror(gai) : "none");
        } else {
            struct sockaddr_in a = *(struct sockaddr_in *)ai->ai_addr;
            a.sin_port = htons((uint16_t)mport);
            freeaddrinfo(ai);
            st = rt_tcp_connect(&a, deadline, &t->fd[0], "rank 0 (MASTER_ADDR:MASTER_PORT)", err);
            RtTcpHello h = {RT_TCP_MAGIC, (uint32_t)r, (uint32_t)P, (uint32_t)port};
            snprintf(what, sizeof what, "saying hello to rank 0");
            if (st == RT_OK) st = rt_tcp_io(t->fd[0], &h, sizeof h, 1, deadline, what, err);
            snprintf(what, sizeof what, "waiting for rank 0's table of addresses (the other ranks have not all come)");
            if (st == RT_OK) st = rt_tcp_io(t->fd[0], table, (size_t)P * sizeof *table, 0, deadline, what, err);
        }
        /* connect to the ranks between 0 and this one, then accept those above */
        for (int i = 1; i < r && st == RT_OK; i++) {
            struct sockaddr_in a = {
                .sin_family = AF_INET, .sin_port = htons((uint16_t)table[i].port), .sin_addr.s_addr = table[i].ip};
            char whom[32];
            snprintf(whom, sizeof whom, "rank %d", i);
            st = rt_tcp_connect(&a, deadline, &t->fd[i], whom, err);
            RtTcpHello h = {RT_TCP_MAGIC, (uint32_t)r, (uint32_t)P, 0};
            snprintf(what, sizeof what, "saying hello to rank %d", i);
            if (st == RT_OK) st = rt_tcp_io(t->fd[i], &h, sizeof h, 1, deadline, what, err);
        }
        for (int i = r + 1; i < P && st == RT_OK; i++) {
            RtTcpHello h;
            struct sockaddr_in from;
            int fd = -1;
            snprintf(what, sizeof what, "rank %d waiting for the connections of ranks %d to %d", r, r + 1, P - 1);
            st = rt_tcp_accept(lfd, deadline, &fd, &h, &from, what, err);
            if (st != RT_OK) break;
            if (h.rank <= (uint32_t)r || h.rank >= (uint32_t)P || t->fd[h.rank] >= 0) {
                close(fd);
                st = rt_fail(err, RT_ERR_ARG, "collectives (tcp): rank %d was connected to by a second rank %u", r, h.rank);
                break;
            }
            t->fd[h.rank] = fd;
        }
    }
    if (lfd >= 0) close(lfd);
    free(table);
    return st;
}

RtStatus rt_comm_open_tcp(RtComm *c, const RtTcpVars *vars, RtError *err) {
    long rank, size, mport = 0, local = 0;
    RtStatus st = rt_env_int(vars, vars->size, 1, 65536, &size, err);
    if (st == RT_OK) st = rt_env_int(vars, vars->rank, 0, size - 1, &rank, err);
    if (st == RT_OK && getenv(vars->local) && *getenv(vars->local)) st = rt_env_int(vars, vars->local, 0, 65535, &local, err);
    if (st == RT_OK && size > 1) st = rt_env_int(vars, "MASTER_PORT", 1, 65535, &mport, err);
    const char *host = getenv("MASTER_ADDR");
    if (st == RT_OK && size > 1 && (!host || !*host))
        st = rt_fail(err, RT_ERR_ARG, "collectives (tcp): MASTER_ADDR is not set (%s sets %s, %s, MASTER_ADDR and MASTER_PORT)",
                     vars->who, vars->rank, vars->size);
    if (st != RT_OK) return st;
    c->rank = (int)rank;
    c->size = (int)size;
    c->local_rank = (int)local;
    RtTcp *t = calloc(1, sizeof *t);
    if (!t) return rt_fail(err, RT_ERR_NOMEM, "collectives (tcp): out of memory");
    c->impl = t;
    c->ops = &rt_tcp_ops;
    t->fd = malloc((size_t)size * sizeof *t->fd);
    t->x = calloc((size_t)size, sizeof *t->x);
    t->pfd = calloc((size_t)size, sizeof *t->pfd);
    t->pfd_rank = calloc((size_t)size, sizeof *t->pfd_rank);
    if (!t->fd || !t->x || !t->pfd || !t->pfd_rank) {
        rt_tcp_free(c);
        return rt_fail(err, RT_ERR_NOMEM, "collectives (tcp): out of memory");
    }
    for (long p = 0; p < size; p++) t->fd[p] = -1;
    if (size > 1) st = rt_tcp_rendezvous(c, host, (int)mport, err);
    if (st != RT_OK && err) {
        /* "collectives (tcp): rank 1 of 2, rendezvous at HOST:PORT: <what failed>" */
        static const char pre[] = "collectives (tcp): ";
        char why[RT_ERROR_MAX];
        snprintf(why, sizeof why, "%s", strncmp(err->msg, pre, sizeof pre - 1) ? err->msg : err->msg + sizeof pre - 1);
        rt_fail(err, st, "%srank %d of %d, rendezvous at %s:%ld: %s", pre, c->rank, c->size, host, mport, why);
    }
    if (st != RT_OK) {
        rt_tcp_free(c);
        return st;
    }
    snprintf(c->backend, sizeof c->backend, "tcp");
    return RT_OK;
}
