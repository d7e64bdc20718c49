/* comm_internal.h - what comm.c shares with its backends (comm_mpi.c, comm_tcp.c) and its GPU
 * transport (comm_nccl.c).
 *
 * comm.c owns the public calls of comm.h: it checks their arguments, times them and hands the
 * work to the world's backend through RtCommOps. A backend sees checked arguments only (shard
 * boundaries that start at 0 and never decrease, a root inside the world, sizes >= 0) and never
 * a world of size 1 unless it chose to be one. */
#ifndef MBT_COMM_INTERNAL_H
#define MBT_COMM_INTERNAL_H

#include "comm.h"
#include "rt_gpu.h"

/* The collectives, in the order of the MBT_DEBUG table. */
typedef enum RtCommOp {
    RT_COMM_EXCHANGE,
    RT_COMM_GATHER_SHARDS,
    RT_COMM_GATHER_F64,
    RT_COMM_BROADCAST,
    RT_COMM_BARRIER,
    RT_COMM_NOPS
} RtCommOp;

const char *rt_comm_op_name(RtCommOp op); /* "exchange_shards", ... (messages, the table) */

typedef struct RtCommOps {
    RtStatus (*exchange)(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err);
    RtStatus (*gather_shards)(RtComm *c, float *v, const int64_t *off, RtError *err);
    RtStatus (*gather_f64)(RtComm *c, const double *mine, int64_t n, double *all, RtError *err);
    RtStatus (*broadcast)(RtComm *c, void *buf, int64_t bytes, int root, RtError *err);
    RtStatus (*barrier)(RtComm *c, RtError *err);
    void (*close)(RtComm *c);             /* frees the backend's state (c->impl) after a clean shutdown */
    void (*abort)(RtComm *c, int status); /* stops the world; may return, comm.c then exits */
} RtCommOps;

typedef struct RtCommStat {
    int64_t calls, bytes; /* bytes: what this rank sent to other ranks */
    double total, max;    /* seconds */
} RtCommStat;

struct RtComm {
    const RtCommOps *ops;
    void *impl; /* the backend's state */
    int rank, size, local_rank;
    double timeout; /* seconds, > 0 */
    char backend[160];
    size_t backend_len; /* the backend's own name's length (rt_comm_set_gpu appends NCCL's) */
    char launcher[32];  /* rt_comm_launcher */
    int debug;          /* MBT_DEBUG >= 1 at open */
    RtCommStat stat[RT_COMM_NOPS];
    RtGpu *gpu;          /* rt_comm_set_gpu: the float vectors are its device memory */
    struct RtNccl *nccl; /* comm_nccl.c: device buffers moved by NCCL; NULL: staged through host copies */
    float *stage[2];     /* host copies of them (grown as needed) */
    int64_t stage_n[2];  /* their sizes in floats */
    double t_open;       /* rt_comm_now() at open: the trace's origin */
    char *trace_path;    /* MBT_TRACE: this rank's file of collectives, or NULL */
    RtGpuEvent *events;  /* the calls, for the trace (at most RT_COMM_TRACE_MAX) */
    int64_t nevents, cap_events;
};

#define RT_COMM_TRACE_MAX (INT64_C(1) << 20)

double rt_comm_now(void); /* monotonic seconds */

/* The backends' openers: each fills c (rank, size, local_rank, backend, ops, impl) or fails with
 * a message; c->timeout is set before the call. */
RtStatus rt_comm_open_mpi(RtComm *c, RtError *err);
/* The tcp rendezvous's variables: torchrun's (RANK, WORLD_SIZE, LOCAL_RANK) or, under srun without
 * PMIx, Slurm's (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID); MASTER_ADDR and MASTER_PORT both. */
typedef struct {
    const char *rank, *size, *local, *who; /* who: "torchrun" or "srun", for the messages */
} RtTcpVars;
RtStatus rt_comm_open_tcp(RtComm *c, const RtTcpVars *vars, RtError *err);

/* comm_nccl.c, the GPU transport (c->gpu set): opens c->nccl when NCCL is there, the world has
 * more than one rank and MBT_NCCL is not 0 (else RT_OK with c->nccl NULL); the collectives on
 * device buffers; the communicator destroyed (or aborted) and c->nccl NULL again. */
RtStatus rt_comm_nccl_open(RtComm *c, RtError *err);
int rt_comm_nccl_version(const RtComm *c); /* ncclGetVersion's 22809, or 0 */
RtStatus rt_comm_nccl_exchange(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err);
RtStatus rt_comm_nccl_gather(RtComm *c, float *v, const int64_t *off, RtError *err);
void rt_comm_nccl_close(RtComm *c, int abort);

#endif
