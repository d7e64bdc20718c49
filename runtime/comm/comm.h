/* comm.h - collectives among the ranks of one run (data parallelism, docs/parallel.md).
 *
 * Pipeline position: a runtime part beside exec/ and io/. train.c opens the world once at start
 * (rt_comm_open), asks it for its rank and size, and calls the collectives below from the step
 * loop: the gradient's shards exchanged and gathered, the step's loss and norm partials gathered,
 * a checkpoint's agreement broadcast. Nothing else in the runtime talks to other processes.
 *
 * One interface, chosen backends (comm.c picks one from the environment):
 *   self  no launcher: one rank, every collective a copy. The same executable runs alone.
 *   mpi   Open MPI's mpirun (OMPI_COMM_WORLD_SIZE set) or srun through PMI/PMIx: libmpi is opened
 *         with dlopen at run time, so executables neither link nor need MPI to run alone.
 *   tcp   torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): a TCP
 *         rendezvous at MASTER_ADDR:MASTER_PORT and a socket to every other rank; no MPI needed.
 * On a GPU, exchange_shards and gather_shards take device buffers once rt_comm_set_gpu has named
 * the GPU: moved by NCCL (bootstrapped through the backend above; comm_nccl.c) when it is there,
 * else staged through host memory (docs/parallel.md, "On GPUs").
 *
 * Determinism. No collective here adds floating-point numbers: the reduce-scatter is split into
 * an exchange (rt_comm_exchange_shards: every rank receives every rank's copy of its own shard,
 * in rank order) and the caller sums those copies in an order it fixes itself (train.c: one
 * binary tree over micro-batch indices, so the gradient's bits do not depend on the number of
 * ranks). The bytes moved are a ring all-reduce's.
 *
 * Failure. Every call is bounded by the timeout given to rt_comm_open (a peer that died or never
 * came is an error naming it, never a hang). A failing call fills err; the caller then calls
 * rt_comm_abort so that the other ranks stop too.
 *
 * Timing. Every collective is timed; with MBT_DEBUG set rt_comm_print_timing prints a table
 * (calls, bytes, total and longest time per collective), and with MBT_TRACE set the calls are
 * events of the Chrome trace (one process per rank). */
#ifndef MBT_COMM_H
#define MBT_COMM_H

#include <stdint.h>
#include <stdio.h>

#include "../rt.h"

typedef struct RtComm RtComm;

/* Opens the world from the environment (see above). timeout_s > 0 bounds the rendezvous and
 * every later call. *out is a world of size 1 when no launcher set the environment. */
RtStatus rt_comm_open(RtComm **out, double timeout_s, RtError *err);
void rt_comm_close(RtComm *c); /* NULL is fine; a clean shutdown (MPI_Finalize) */
/* Stops every rank of the world now (MPI_Abort; tcp: the sockets closed, so peers' calls fail
 * at once), after this rank's caller has printed why. Does not return. */
_Noreturn void rt_comm_abort(RtComm *c, int status);

int rt_comm_rank(const RtComm *c);            /* 0 .. size-1 */
int rt_comm_size(const RtComm *c);            /* 1 for the self backend */
int rt_comm_local_rank(const RtComm *c);      /* rank among this machine's ranks: which GPU to use */
const char *rt_comm_backend(const RtComm *c); /* "self", "mpi (Open MPI 4.1.4)", "tcp" */
/* Who started the ranks, for messages ("this program trains with parallel.data = 2 ranks; mpirun
 * started 3"): "mpirun", "srun", "torchrun (WORLD_SIZE)", "MBT_COMM=..." or "nothing". */
const char *rt_comm_launcher(const RtComm *c);

/* The gradient's shards: shard j is elements [off[j], off[j+1]) of an n-element vector, with
 * off[0] = 0 and off[size] = n (the caller picks the boundaries; rt_comm_shards below gives
 * equal ones). Every rank passes its whole vector `mine` (n floats); rank r receives into `got`
 * the size copies of shard r, rank 0's first: got[i * len + k] = rank i's mine[off[r] + k] with
 * len = off[r+1] - off[r]. got (size x len floats) must not overlap mine. */
RtStatus rt_comm_exchange_shards(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err);
/* The inverse gather: every rank's shard r of `v` (its own, already final) is copied into every
 * other rank's v, so that all ranks end with the same n floats. */
RtStatus rt_comm_gather_shards(RtComm *c, float *v, const int64_t *off, RtError *err);
/* Every rank's n doubles, rank 0's first, into all (size x n); the caller adds them in rank order
 * (the step's loss, the gradient norm's partial sums). */
RtStatus rt_comm_gather_f64(RtComm *c, const double *mine, int64_t n, double *all, RtError *err);
/* Rank root's `bytes` bytes at buf copied to every rank's buf. */
RtStatus rt_comm_broadcast(RtComm *c, void *buf, int64_t bytes, int root, RtError *err);
RtStatus rt_comm_barrier(RtComm *c, RtError *err);

/* The timeout rt_comm_open is given by the executable: MBT_COMM_TIMEOUT (seconds, > 0) where it
 * is set, else RT_COMM_TIMEOUT_DEFAULT; a malformed value is an error naming it. */
#define RT_COMM_TIMEOUT_DEFAULT 600.0
RtStatus rt_comm_timeout_env(double *timeout_s, RtError *err);

/* GPU buffers: after rt_comm_set_gpu(c, g, err), the float vectors of rt_comm_exchange_shards
 * (mine, got) and rt_comm_gather_shards (v) are device memory of g. With more than one rank and
 * NCCL found by g's runtime (MBT_NCCL=0: never), the call opens an NCCL communicator among the
 * ranks (rank 0's id broadcast through this world) and both collectives move device memory GPU to
 * GPU on g's stream (comm_nccl.c; rt_comm_nccl says so, rt_comm_backend names NCCL's version).
 * Otherwise each call downloads what this rank sends, runs the collective on host copies and
 * uploads what it received (rt_gpu_download waits for g's stream first; the upload is queued on
 * it). Either way the call returns when the received data is in place. gather_f64 and broadcast
 * keep taking host memory. g NULL: host buffers again (and NCCL's communicator destroyed: call it
 * before closing g). The copies are part of each call's time. */
typedef struct RtGpu RtGpu;
RtStatus rt_comm_set_gpu(RtComm *c, RtGpu *g, RtError *err);
int rt_comm_nccl(const RtComm *c);
/* With NCCL: on (1), exchange_shards and gather_shards queue their group on the GPU's current
 * stream and return once NCCL has taken it, without waiting for the stream (the GPU's buckets
 * overlapped with the backward queue them on a communication stream; docs/parallel.md); off (0,
 * the default), each waits for its stream. Nothing without NCCL. */
void rt_comm_nccl_queue_only(RtComm *c, int on);
/* With NCCL: waits until NCCL has no call in progress and the GPU's (compute) stream has run what
 * was queued on it, against the world's timeout (past it the communicator is aborted, as a
 * collective's own wait does). RT_OK at once without NCCL. */
RtStatus rt_comm_nccl_settle(RtComm *c, const char *what, RtError *err);

/* Equal shard boundaries for n elements over size ranks, each a multiple of `align` elements
 * except the last: off has size + 1 entries. */
void rt_comm_shards(int64_t n, int size, int64_t align, int64_t *off);

/* MBT_DEBUG: the collectives' table (nothing when no call was made or MBT_DEBUG is unset). */
void rt_comm_print_timing(FILE *f, const RtComm *c);
/* MBT_TRACE=FILE.json: every call (up to 2^20) as an event of a Chrome trace of this rank's own,
 * FILE.comm-rankR.json (the GPU's trace keeps FILE.json); its origin is rt_comm_open. Writes
 * nothing (and *path NULL) when MBT_TRACE is unset or no call was made; else *path is the file. */
RtStatus rt_comm_trace_write(RtComm *c, const char **path, RtError *err);

#endif
