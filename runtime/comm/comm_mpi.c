/* comm_mpi.c - the mpi backend (comm.h): Open MPI's libmpi.so.40, opened with dlopen when the run
 * starts, so that executables neither link MPI nor need it installed to run alone.
 *
 * No MPI header is needed to build: the few functions called are declared here with Open MPI's
 * types (handles are pointers to opaque structs; MPI_COMM_WORLD, MPI_FLOAT, MPI_DOUBLE, MPI_BYTE
 * and MPI_ERRORS_RETURN are the addresses of the exported globals ompi_mpi_comm_world etc., taken
 * with dlsym; MPI_IN_PLACE is (void *)1 and MPI_STATUS_IGNORE NULL, as Open MPI's mpi.h defines
 * them). This is Open MPI's ABI, not MPI's: MPICH's libmpi.so.12 is not supported.
 *
 * Every collective is the non-blocking form (MPI_Ialltoallv, MPI_Iallgatherv, MPI_Iallgather,
 * MPI_Ibcast, MPI_Ibarrier) polled with MPI_Test until it completes or the world's timeout
 * passes: a rank that never arrives is an error naming the collective and the wait, never a
 * hang. (A rank that dies is seen by mpirun itself, which then stops the whole job.) Errors are
 * returned, not fatal: the world's error handler is MPI_ERRORS_RETURN.
 *
 * MPI_Init_thread asks for MPI_THREAD_SERIALIZED: the data-parallel step may call the collectives
 * from a communication thread, one call at a time. MPI_Init itself is not bounded by the timeout
 * (it has no non-blocking form); mpirun bounds its own start-up. */
#include <dlfcn.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

typedef struct ompi_communicator_t *MPI_Comm;
typedef struct ompi_datatype_t *MPI_Datatype;
typedef struct ompi_request_t *MPI_Request;
typedef struct ompi_errhandler_t *MPI_Errhandler;
typedef struct ompi_status_public_t MPI_Status;

#define RT_MPI_SUCCESS 0
#define RT_MPI_THREAD_SERIALIZED 2
#define RT_MPI_IN_PLACE ((void *)1)
#define RT_MPI_STATUS_IGNORE ((MPI_Status *)0)
#define RT_MPI_LIB "libmpi.so.40"

typedef struct RtMpiApi {
    int (*Initialized)(int *flag);
    int (*Init_thread)(int *argc, char ***argv, int required, int *provided);
    int (*Finalize)(void);
    int (*Finalized)(int *flag);
    int (*Abort)(MPI_Comm comm, int errorcode);
    int (*Comm_rank)(MPI_Comm comm, int *rank);
    int (*Comm_size)(MPI_Comm comm, int *size);
    int (*Comm_set_errhandler)(MPI_Comm comm, MPI_Errhandler errhandler);
    int (*Error_string)(int errorcode, char *string, int *resultlen);
    int (*Get_library_version)(char *version, int *resultlen);
    int (*Ialltoallv)(const void *sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype, void *recvbuf,
                      const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request);
    int (*Iallgatherv)(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, const int recvcounts[],
                       const int displs[], MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request);
    int (*Iallgather)(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                      MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request);
    int (*Ibcast)(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm, MPI_Request *request);
    int (*Ibarrier)(MPI_Comm comm, MPI_Request *request);
    int (*Test)(MPI_Request *request, int *flag, MPI_Status *status);
} RtMpiApi;

typedef struct RtMpi {
    void *lib;
    RtMpiApi api;
    MPI_Comm world;
    MPI_Datatype f32, f64, byte;
    int *counts; /* 4 x size: send counts and displacements, receive counts and displacements */
} RtMpi;

/* "MPI_Ialltoallv failed in exchange_shards: <MPI's reason>" */
static RtStatus rt_mpi_fail(RtMpi *m, int rc, RtError *err, const char *call, const char *what) {
    char reason[512];
    int len = 0;
    if (!m->api.Error_string || m->api.Error_string(rc, reason, &len) != RT_MPI_SUCCESS)
        snprintf(reason, sizeof reason, "error %d", rc);
    else reason[len < (int)sizeof reason ? len : (int)sizeof reason - 1] = 0;
    return rt_fail(err, RT_ERR_IO, "collectives (mpi): %s failed in %s: %s", call, what, reason);
}

/* Waits for req until the world's timeout passes. MPI_Test drives MPI's progress; between tests
 * the rank spins briefly, then yields, then sleeps (100 us, later 1 ms) so that oversubscribed
 * ranks (mpirun --oversubscribe on fewer cores) leave the processor to the peers they wait for. */
static RtStatus rt_mpi_wait(RtComm *c, MPI_Request *req, RtCommOp op, RtError *err) {
    RtMpi *m = c->impl;
    double t0 = rt_comm_now(), deadline = t0 + c->timeout;
    for (int64_t i = 0;; i++) {
        int done = 0;
        int rc = m->api.Test(req, &done, RT_MPI_STATUS_IGNORE);
        if (rc != RT_MPI_SUCCESS) return rt_mpi_fail(m, rc, err, "MPI_Test", rt_comm_op_name(op));
        if (done) return RT_OK;
        double now = rt_comm_now();
        if (now > deadline)
            return rt_fail(err, RT_ERR_IO,
                           "collectives (mpi): rank %d of %d timed out after %.3g s waiting in %s for the other ranks (a rank "
                           "stopped, is stuck or is much slower; MBT_COMM_TIMEOUT sets the wait)",
                           c->rank, c->size, now - t0, rt_comm_op_name(op));
        if (i < 200) continue;
        if (now - t0 < 2e-3) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, now - t0 < 0.1 ? 100000 : 1000000};
        nanosleep(&ts, NULL);
    }
}

static RtStatus rt_mpi_count(int64_t v, const char *what, int *out, RtError *err) {
    if (v > INT_MAX)
        return rt_fail(err, RT_ERR_ARG, "collectives (mpi): %s: %lld elements is more than MPI's int counts hold (%d)", what,
                       (long long)v, INT_MAX);
    *out = (int)v;
    return RT_OK;
}

static RtStatus rt_mpi_exchange(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err) {
    RtMpi *m = c->impl;
    const char *what = "exchange_shards";
    int P = c->size, r = c->rank;
    int *sc = m->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P;
    int64_t len = off[r + 1] - off[r];
    RtStatus st = RT_OK;
    for (int j = 0; j < P && st == RT_OK; j++) {
        st = rt_mpi_count(off[j + 1] - off[j], what, &sc[j], err);
        if (st == RT_OK) st = rt_mpi_count(off[j], what, &sd[j], err);
        if (st == RT_OK) st = rt_mpi_count(len, what, &rc[j], err);
        if (st == RT_OK) st = rt_mpi_count(len * j, what, &rd[j], err);
    }
    if (st != RT_OK) return st;
    MPI_Request req;
    int e = m->api.Ialltoallv(mine, sc, sd, m->f32, got, rc, rd, m->f32, m->world, &req);
    if (e != RT_MPI_SUCCESS) return rt_mpi_fail(m, e, err, "MPI_Ialltoallv", what);
    return rt_mpi_wait(c, &req, RT_COMM_EXCHANGE, err);
}

static RtStatus rt_mpi_gather_shards(RtComm *c, float *v, const int64_t *off, RtError *err) {
    RtMpi *m = c->impl;
    const char *what = "gather_shards";
    int P = c->size;
    int *rc = m->counts, *rd = rc + P;
    RtStatus st = RT_OK;
    for (int j = 0; j < P && st == RT_OK; j++) {
        st = rt_mpi_count(off[j + 1] - off[j], what, &rc[j], err);
        if (st == RT_OK) st = rt_mpi_count(off[j], what, &rd[j], err);
    }
    if (st != RT_OK) return st;
    MPI_Request req;
    int e = m->api.Iallgatherv(RT_MPI_IN_PLACE, 0, m->f32, v, rc, rd, m->f32, m->world, &req);
    if (e != RT_MPI_SUCCESS) return rt_mpi_fail(m, e, err, "MPI_Iallgatherv", what);
    return rt_mpi_wait(c, &req, RT_COMM_GATHER_SHARDS, err);
}

static RtStatus rt_mpi_gather_f64(RtComm *c, const double *mine, int64_t n, double *all, RtError *err) {
    RtMpi *m = c->impl;
    int cnt;
    RtStatus st = rt_mpi_count(n * c->size, "gather_f64", &cnt, err);
    if (st != RT_OK) return st;
    MPI_Request req;
    int e = m->api.Iallgather(mine, (int)n, m->f64, all, (int)n, m->f64, m->world, &req);
    if (e != RT_MPI_SUCCESS) return rt_mpi_fail(m, e, err, "MPI_Iallgather", "gather_f64");
    return rt_mpi_wait(c, &req, RT_COMM_GATHER_F64, err);
}

static RtStatus rt_mpi_broadcast(RtComm *c, void *buf, int64_t bytes, int root, RtError *err) {
    RtMpi *m = c->impl;
    /* in pieces of at most 1 GiB: MPI's counts are ints */
    const int64_t piece = INT64_C(1) << 30;
    int64_t done = 0;
    do {
        int64_t k = bytes - done < piece ? bytes - done : piece;
        MPI_Request req;
        int e = m->api.Ibcast((char *)buf + done, (int)k, m->byte, root, m->world, &req);
        if (e != RT_MPI_SUCCESS) return rt_mpi_fail(m, e, err, "MPI_Ibcast", "broadcast");
        RtStatus st = rt_mpi_wait(c, &req, RT_COMM_BROADCAST, err);
        if (st != RT_OK) return st;
        done += k;
    } while (done < bytes);
    return RT_OK;
}

static RtStatus rt_mpi_barrier(RtComm *c, RtError *err) {
    RtMpi *m = c->impl;
    MPI_Request req;
    int e = m->api.Ibarrier(m->world, &req);
    if (e != RT_MPI_SUCCESS) return rt_mpi_fail(m, e, err, "MPI_Ibarrier", "barrier");
    return rt_mpi_wait(c, &req, RT_COMM_BARRIER, err);
}

static void rt_mpi_close(RtComm *c) {
    RtMpi *m = c->impl;
    if (!m) return;
    int fin = 1;
    if (m->api.Finalized(&fin) == RT_MPI_SUCCESS && !fin) m->api.Finalize();
    /* libmpi stays loaded: its plugins and atexit handlers may still refer to it */
    free(m->counts);
    free(m);
    c->impl = NULL;
}

static void rt_mpi_abort(RtComm *c, int status) {
    RtMpi *m = c->impl;
    if (m) m->api.Abort(m->world, status ? status : 1);
}

static const RtCommOps rt_mpi_ops = {rt_mpi_exchange, rt_mpi_gather_shards, rt_mpi_gather_f64, rt_mpi_broadcast,
                                     rt_mpi_barrier,  rt_mpi_close,         rt_mpi_abort};

/* The local rank: the launcher's variable, else 0. */
static int rt_mpi_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "PMIX_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

RtStatus rt_comm_open_mpi(RtComm *c, RtError *err) {
    RtMpi *m = calloc(1, sizeof *m);
    if (!m) return rt_fail(err, RT_ERR_NOMEM, "collectives (mpi): out of memory");
    dlerror();
    /* RTLD_GLOBAL: Open MPI's plugins (mca_*.so) resolve their symbols against libmpi's */
    m->lib = dlopen(RT_MPI_LIB, RTLD_NOW | RTLD_GLOBAL);
    if (!m->lib) {
        const char *why = dlerror();
        free(m);
        return rt_fail(err, RT_ERR_NOTFOUND,
                       "collectives (mpi): a launcher started this run (mpirun or srun) but Open MPI's %s cannot be "
                       "opened: %s (install Open MPI: apt-get install openmpi-bin; MBT_COMM=self runs alone)",
                       RT_MPI_LIB, why ? why : "?");
    }
    struct {
        const char *name;
        void **slot;
    } fns[] = {
        {"MPI_Initialized", (void **)&m->api.Initialized},
        {"MPI_Init_thread", (void **)&m->api.Init_thread},
        {"MPI_Finalize", (void **)&m->api.Finalize},
        {"MPI_Finalized", (void **)&m->api.Finalized},
        {"MPI_Abort", (void **)&m->api.Abort},
        {"MPI_Comm_rank", (void **)&m->api.Comm_rank},
        {"MPI_Comm_size", (void **)&m->api.Comm_size},
        {"MPI_Comm_set_errhandler", (void **)&m->api.Comm_set_errhandler},
        {"MPI_Error_string", (void **)&m->api.Error_string},
        {"MPI_Get_library_version", (void **)&m->api.Get_library_version},
        {"MPI_Ialltoallv", (void **)&m->api.Ialltoallv},
        {"MPI_Iallgatherv", (void **)&m->api.Iallgatherv},
        {"MPI_Iallgather", (void **)&m->api.Iallgather},
        {"MPI_Ibcast", (void **)&m->api.Ibcast},
        {"MPI_Ibarrier", (void **)&m->api.Ibarrier},
        {"MPI_Test", (void **)&m->api.Test},
    };
    void *errors_return = NULL;
    struct {
        const char *name;
        void **slot;
    } globals[] = {
        {"ompi_mpi_comm_world", (void **)&m->world}, {"ompi_mpi_float", (void **)&m->f32},
        {"ompi_mpi_double", (void **)&m->f64},       {"ompi_mpi_byte", (void **)&m->byte},
        {"ompi_mpi_errors_return", &errors_return},
    };
    const char *missing = NULL;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0] && !missing; i++)
        if (!(*fns[i].slot = dlsym(m->lib, fns[i].name))) missing = fns[i].name;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0] && !missing; i++)
        if (!(*globals[i].slot = dlsym(m->lib, globals[i].name))) missing = globals[i].name;
    if (missing) {
        free(m);
        return rt_fail(err, RT_ERR_NOTFOUND, "collectives (mpi): %s has no %s (is it Open MPI 4 or later?)", RT_MPI_LIB, missing);
    }
    int inited = 0, provided = 0, rc = m->api.Initialized(&inited);
    if (rc == RT_MPI_SUCCESS && !inited) rc = m->api.Init_thread(NULL, NULL, RT_MPI_THREAD_SERIALIZED, &provided);
    else provided = RT_MPI_THREAD_SERIALIZED;
    if (rc != RT_MPI_SUCCESS) {
        RtStatus st = rt_mpi_fail(m, rc, err, "MPI_Init_thread", "opening the world");
        free(m);
        return st;
    }
    c->impl = m;
    c->ops = &rt_mpi_ops;
    const char *step = "MPI_Comm_set_errhandler";
    rc = m->api.Comm_set_errhandler(m->world, (MPI_Errhandler)errors_return);
    if (rc == RT_MPI_SUCCESS) step = "MPI_Comm_rank", rc = m->api.Comm_rank(m->world, &c->rank);
    if (rc == RT_MPI_SUCCESS) step = "MPI_Comm_size", rc = m->api.Comm_size(m->world, &c->size);
    if (rc != RT_MPI_SUCCESS) {
        RtStatus st = rt_mpi_fail(m, rc, err, step, "opening the world");
        rt_mpi_close(c);
        return st;
    }
    if (provided < RT_MPI_THREAD_SERIALIZED) {
        rt_mpi_close(c);
        return rt_fail(err, RT_ERR_IO, "collectives (mpi): MPI provides thread level %d, not MPI_THREAD_SERIALIZED", provided);
    }
    m->counts = calloc((size_t)c->size * 4, sizeof *m->counts);
    if (!m->counts) {
        rt_mpi_close(c);
        return rt_fail(err, RT_ERR_NOMEM, "collectives (mpi): out of memory");
    }
    c->local_rank = rt_mpi_local_rank();
    /* "Open MPI v4.1.4, package: ..." -> "mpi (Open MPI 4.1.4)" */
    char ver[1024] = "";
    int vlen = 0;
    if (m->api.Get_library_version(ver, &vlen) == RT_MPI_SUCCESS) {
        ver[vlen > 0 && vlen < (int)sizeof ver ? vlen : (int)sizeof ver - 1] = 0;
        ver[strcspn(ver, ",\n")] = 0;
        char *v = strstr(ver, " v");
        if (v && v[2] >= '0' && v[2] <= '9') memmove(v + 1, v + 2, strlen(v + 2) + 1);
    }
    snprintf(c->backend, sizeof c->backend, "mpi (%.80s)", *ver ? ver : "MPI");
    return RT_OK;
}
