/* comm.c - the world of a run and its collectives (comm.h): the backend chosen from the
 * environment, every call's arguments checked and timed here, the self backend (one rank), equal
 * shard boundaries and the MBT_DEBUG table. The mpi and tcp backends are comm_mpi.c and
 * comm_tcp.c (comm_internal.h is what they share with this file).
 *
 * Choosing the backend (docs/parallel.md, "Launching"):
 *   MBT_COMM=self|mpi|tcp           forces one (a launcher's variables are then ignored)
 *   OMPI_COMM_WORLD_SIZE            mpirun (Open MPI)                          -> mpi
 *   PMIX_RANK, PMI_RANK or PMI_SIZE srun with PMIx or PMI-2 (--mpi=pmix|pmi2)   -> mpi
 *   RANK and WORLD_SIZE             torchrun (with MASTER_ADDR, MASTER_PORT)    -> tcp
 *   SLURM_STEP_NUM_TASKS > 1 alone  srun --mpi=none (Slurm's default): tcp with SLURM_PROCID as
 *                                   the rank if MASTER_ADDR and MASTER_PORT are set, else an error
 *                                   (each task would otherwise train alone, on the same files)
 *   none of these                                                               -> self
 * (SLURM_STEP_NUM_TASKS is srun's: a batch script's own shell has SLURM_NTASKS but runs alone.) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"
#include "rt_program.h"

static const char *const rt_comm_op_names[RT_COMM_NOPS] = {"exchange_shards", "gather_shards", "gather_f64", "broadcast",
                                                           "barrier"};

const char *rt_comm_op_name(RtCommOp op) { return op >= 0 && op < RT_COMM_NOPS ? rt_comm_op_names[op] : "?"; }

double rt_comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the self backend: one rank, every collective a copy ------------------------------------- */

static RtStatus rt_self_exchange(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err) {
    (void)c;
    (void)err;
    int64_t len = off[1] - off[0];
    if (len > 0) memcpy(got, mine + off[0], (size_t)len * sizeof *got);
    return RT_OK;
}

static RtStatus rt_self_gather_shards(RtComm *c, float *v, const int64_t *off, RtError *err) {
    (void)c, (void)v, (void)off, (void)err; /* the only shard is this rank's own, already in v */
    return RT_OK;
}

static RtStatus rt_self_gather_f64(RtComm *c, const double *mine, int64_t n, double *all, RtError *err) {
    (void)c;
    (void)err;
    if (n > 0 && all != mine) memmove(all, mine, (size_t)n * sizeof *all);
    return RT_OK;
}

static RtStatus rt_self_broadcast(RtComm *c, void *buf, int64_t bytes, int root, RtError *err) {
    (void)c, (void)buf, (void)bytes, (void)root, (void)err; /* the root is this rank */
    return RT_OK;
}

static RtStatus rt_self_barrier(RtComm *c, RtError *err) {
    (void)c, (void)err;
    return RT_OK;
}

static void rt_self_close(RtComm *c) { (void)c; }
static void rt_self_abort(RtComm *c, int status) { (void)c, (void)status; }

static const RtCommOps rt_self_ops = {rt_self_exchange, rt_self_gather_shards, rt_self_gather_f64, rt_self_broadcast,
                                      rt_self_barrier,  rt_self_close,         rt_self_abort};

/* ---- opening the world ------------------------------------------------------------------------ */

static int rt_env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

RtStatus rt_comm_open(RtComm **out, double timeout_s, RtError *err) {
    *out = NULL;
    if (!(timeout_s > 0) || timeout_s > 1e9)
        return rt_fail(err, RT_ERR_ARG, "collectives: the timeout must be a number of seconds above 0 (it is %g)", timeout_s);
    const char *force = getenv("MBT_COMM");
    const char *kind = "self";
    int slurm = 0; /* tcp with Slurm's variables */
    if (force && *force) {
        if (strcmp(force, "self") != 0 && strcmp(force, "mpi") != 0 && strcmp(force, "tcp") != 0)
            return rt_fail(err, RT_ERR_ARG, "MBT_COMM is '%.40s': it must be self, mpi or tcp", force);
        kind = force;
    } else if (rt_env_set("OMPI_COMM_WORLD_SIZE") || rt_env_set("PMIX_RANK") || rt_env_set("PMI_RANK") ||
               rt_env_set("PMI_SIZE")) {
        kind = "mpi";
    } else if (rt_env_set("RANK") && rt_env_set("WORLD_SIZE")) {
        kind = "tcp";
    } else if (rt_env_set("SLURM_STEP_NUM_TASKS") && strcmp(getenv("SLURM_STEP_NUM_TASKS"), "1") != 0) {
        if (!rt_env_set("MASTER_ADDR") || !rt_env_set("MASTER_PORT"))
            return rt_fail(err, RT_ERR_ARG,
                           "collectives: srun started %.20s tasks without PMIx (srun --mpi=none, Slurm's default), so no "
                           "task can find the others and each would train alone: give srun --mpi=pmix (Open MPI), or set "
                           "MASTER_ADDR and MASTER_PORT for the tcp rendezvous (the rank is SLURM_PROCID)",
                           getenv("SLURM_STEP_NUM_TASKS"));
        kind = "tcp", slurm = 1;
    }
    RtComm *c = calloc(1, sizeof *c);
    if (!c) return rt_fail(err, RT_ERR_NOMEM, "collectives: out of memory");
    c->timeout = timeout_s;
    const char *debug = getenv("MBT_DEBUG");
    c->debug = debug && atoi(debug) >= 1;
    if (force && *force) snprintf(c->launcher, sizeof c->launcher, "MBT_COMM=%s", kind);
    else if (strcmp(kind, "mpi") == 0)
        snprintf(c->launcher, sizeof c->launcher, "%s", rt_env_set("OMPI_COMM_WORLD_SIZE") ? "mpirun" : "srun");
    else if (slurm) snprintf(c->launcher, sizeof c->launcher, "srun (MASTER_ADDR)");
    else if (strcmp(kind, "tcp") == 0) snprintf(c->launcher, sizeof c->launcher, "torchrun (WORLD_SIZE)");
    else snprintf(c->launcher, sizeof c->launcher, "nothing");
    RtStatus st = RT_OK;
    if (strcmp(kind, "mpi") == 0) {
        st = rt_comm_open_mpi(c, err);
    } else if (strcmp(kind, "tcp") == 0) {
        static const RtTcpVars torchrun = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
                               srun = {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "srun"};
        st = rt_comm_open_tcp(c, slurm ? &srun : &torchrun, err);
    } else {
        c->ops = &rt_self_ops;
        c->size = 1;
        snprintf(c->backend, sizeof c->backend, "self");
    }
    if (st != RT_OK) {
        free(c);
        return st;
    }
    c->t_open = rt_comm_now();
    const char *trace = getenv("MBT_TRACE");
    if (trace && *trace) { /* FILE.json -> FILE.comm-rankR.json */
        size_t n = strlen(trace), stem = n > 5 && strcmp(trace + n - 5, ".json") == 0 ? n - 5 : n;
        c->trace_path = malloc(stem + 40);
        if (!c->trace_path) {
            rt_comm_close(c);
            return rt_fail(err, RT_ERR_NOMEM, "collectives: out of memory");
        }
        snprintf(c->trace_path, stem + 40, "%.*s.comm-rank%d.json", (int)stem, trace, c->rank);
    }
    *out = c;
    return RT_OK;
}

void rt_comm_close(RtComm *c) {
    if (!c) return;
    rt_comm_nccl_close(c, 0);
    c->ops->close(c);
    free(c->stage[0]);
    free(c->stage[1]);
    free(c->trace_path);
    free(c->events);
    free(c);
}

_Noreturn void rt_comm_abort(RtComm *c, int status) {
    fflush(NULL); /* the caller's message first: the backend may kill this process */
    if (c) rt_comm_nccl_close(c, 1);
    if (c) c->ops->abort(c, status);
    _exit(status ? status : 1);
}

int rt_comm_rank(const RtComm *c) { return c->rank; }
int rt_comm_size(const RtComm *c) { return c->size; }
int rt_comm_local_rank(const RtComm *c) { return c->local_rank; }
const char *rt_comm_backend(const RtComm *c) { return c->backend; }
const char *rt_comm_launcher(const RtComm *c) { return c->launcher; }

/* ---- the collectives: checked, timed, handed to the backend ----------------------------------- */

static void rt_comm_count(RtComm *c, RtCommOp op, double t0, int64_t bytes) {
    double dt = rt_comm_now() - t0;
    RtCommStat *s = &c->stat[op];
    s->calls++;
    s->bytes += bytes;
    s->total += dt;
    if (dt > s->max) s->max = dt;
    if (!c->trace_path || c->nevents >= RT_COMM_TRACE_MAX) return;
    if (c->nevents == c->cap_events) {
        int64_t cap = c->cap_events ? 2 * c->cap_events : 256;
        RtGpuEvent *ev = realloc(c->events, (size_t)cap * sizeof *ev);
        if (!ev) return; /* the trace then ends early; the calls go on */
        c->events = ev;
        c->cap_events = cap;
    }
    c->events[c->nevents++] = (RtGpuEvent){rt_comm_op_names[op], 1e6 * (t0 - c->t_open), 1e6 * dt, RT_GPU_TRACK_COMM};
}

RtStatus rt_comm_trace_write(RtComm *c, const char **path, RtError *err) {
    *path = NULL;
    if (!c || !c->trace_path || c->nevents == 0) return RT_OK;
    RtStatus st = rt_gpu_trace_write(c->trace_path, c->events, c->nevents, err);
    if (st != RT_OK) return rt_error_context(err, "the collectives' trace (MBT_TRACE)");
    *path = c->trace_path;
    return RT_OK;
}

/* Host staging buffer i with room for n floats. */
static RtStatus rt_comm_stage(RtComm *c, int i, int64_t n, float **out, RtError *err) {
    if (n > c->stage_n[i]) {
        float *p = realloc(c->stage[i], (size_t)n * sizeof *p);
        if (!p) return rt_fail(err, RT_ERR_NOMEM, "collectives: out of memory for %lld floats of GPU staging", (long long)n);
        c->stage[i] = p;
        c->stage_n[i] = n;
    }
    *out = c->stage[i];
    return RT_OK;
}

RtStatus rt_comm_set_gpu(RtComm *c, RtGpu *g, RtError *err) {
    if (c->nccl) { /* the communicator belongs to the GPU it was opened on */
        rt_comm_nccl_close(c, 0);
        c->backend[c->backend_len] = 0;
    }
    c->gpu = g;
    if (!g) return RT_OK;
    RtStatus st = rt_comm_nccl_open(c, err);
    c->backend_len = strlen(c->backend);
    if (st == RT_OK && c->nccl) {
        int v = rt_comm_nccl_version(c);
        snprintf(c->backend + c->backend_len, sizeof c->backend - c->backend_len, "; GPU buffers over NCCL %d.%d.%d", v / 10000,
                 v / 100 % 100, v % 100);
    }
    return st;
}

int rt_comm_nccl(const RtComm *c) { return c->nccl != NULL; }

/* off[0] = 0, never decreasing. */
static RtStatus rt_check_off(const RtComm *c, const int64_t *off, const char *what, RtError *err) {
    if (!off) return rt_fail(err, RT_ERR_ARG, "%s: no shard boundaries", what);
    if (off[0] != 0) return rt_fail(err, RT_ERR_ARG, "%s: the first shard starts at %" PRId64 ", not 0", what, off[0]);
    for (int j = 0; j < c->size; j++)
        if (off[j + 1] < off[j])
            return rt_fail(err, RT_ERR_ARG, "%s: shard %d ends at %" PRId64 ", before it starts (%" PRId64 ")", what, j,
                           off[j + 1], off[j]);
    return RT_OK;
}

RtStatus rt_comm_exchange_shards(RtComm *c, const float *mine, const int64_t *off, float *got, RtError *err) {
    const char *what = "collectives: exchange_shards";
    RtStatus st = rt_check_off(c, off, what, err);
    if (st != RT_OK) return st;
    int64_t n = off[c->size], len = off[c->rank + 1] - off[c->rank];
    if ((n > 0 && !mine) || (len > 0 && !got)) return rt_fail(err, RT_ERR_ARG, "%s: a NULL buffer", what);
    /* refused on every backend (MPI forbids it), so that a caller that works alone works on many */
    if (len > 0 && n > 0 && (const float *)got < mine + n && mine < (const float *)got + len * c->size)
        return rt_fail(err, RT_ERR_ARG, "%s: the buffer receiving the shards overlaps this rank's vector", what);
    double t0 = rt_comm_now();
    if (c->nccl) { /* device buffers, GPU to GPU */
        st = rt_comm_nccl_exchange(c, mine, off, got, err);
    } else if (c->gpu) { /* device buffers: through host copies */
        float *hm = NULL, *hg = NULL;
        st = rt_comm_stage(c, 0, n, &hm, err);
        if (st == RT_OK) st = rt_comm_stage(c, 1, len * c->size, &hg, err);
        if (st == RT_OK && n > 0) st = rt_gpu_download(c->gpu, hm, mine, n * (int64_t)sizeof *hm, err);
        if (st == RT_OK) st = c->ops->exchange(c, hm, off, hg, err);
        if (st == RT_OK && len > 0) st = rt_gpu_upload(c->gpu, got, hg, len * c->size * (int64_t)sizeof *hg, err);
        if (st != RT_OK) rt_error_context(err, "%s (GPU buffers staged through host memory)", what);
    } else {
        st = c->ops->exchange(c, mine, off, got, err);
    }
    if (st == RT_OK) rt_comm_count(c, RT_COMM_EXCHANGE, t0, (int64_t)sizeof(float) * (n - len));
    return st;
}

RtStatus rt_comm_gather_shards(RtComm *c, float *v, const int64_t *off, RtError *err) {
    const char *what = "collectives: gather_shards";
    RtStatus st = rt_check_off(c, off, what, err);
    if (st != RT_OK) return st;
    int64_t n = off[c->size], len = off[c->rank + 1] - off[c->rank];
    if (n > 0 && !v) return rt_fail(err, RT_ERR_ARG, "%s: a NULL buffer", what);
    double t0 = rt_comm_now();
    if (c->nccl) { /* device buffers, GPU to GPU */
        st = rt_comm_nccl_gather(c, v, off, err);
    } else if (c->gpu) { /* device buffers: this rank's shard down, the others' up */
        float *h = NULL;
        int64_t r0 = off[c->rank], r1 = off[c->rank + 1];
        st = rt_comm_stage(c, 0, n, &h, err);
        if (st == RT_OK && len > 0) st = rt_gpu_download(c->gpu, h + r0, v + r0, len * (int64_t)sizeof *h, err);
        if (st == RT_OK) st = c->ops->gather_shards(c, h, off, err);
        if (st == RT_OK && r0 > 0) st = rt_gpu_upload(c->gpu, v, h, r0 * (int64_t)sizeof *h, err);
        if (st == RT_OK && n > r1) st = rt_gpu_upload(c->gpu, v + r1, h + r1, (n - r1) * (int64_t)sizeof *h, err);
        if (st != RT_OK) rt_error_context(err, "%s (GPU buffers staged through host memory)", what);
    } else {
        st = c->ops->gather_shards(c, v, off, err);
    }
    if (st == RT_OK) rt_comm_count(c, RT_COMM_GATHER_SHARDS, t0, (int64_t)sizeof(float) * len * (c->size - 1));
    return st;
}

RtStatus rt_comm_gather_f64(RtComm *c, const double *mine, int64_t n, double *all, RtError *err) {
    const char *what = "collectives: gather_f64";
    if (n < 0) return rt_fail(err, RT_ERR_ARG, "%s: %" PRId64 " values", what, n);
    if (n > 0 && (!mine || !all)) return rt_fail(err, RT_ERR_ARG, "%s: a NULL buffer", what);
    double t0 = rt_comm_now();
    RtStatus st = c->ops->gather_f64(c, mine, n, all, err);
    if (st == RT_OK) rt_comm_count(c, RT_COMM_GATHER_F64, t0, (int64_t)sizeof(double) * n * (c->size - 1));
    return st;
}

RtStatus rt_comm_broadcast(RtComm *c, void *buf, int64_t bytes, int root, RtError *err) {
    const char *what = "collectives: broadcast";
    if (root < 0 || root >= c->size)
        return rt_fail(err, RT_ERR_ARG, "%s: root %d is not a rank of this world (size %d)", what, root, c->size);
    if (bytes < 0) return rt_fail(err, RT_ERR_ARG, "%s: %" PRId64 " bytes", what, bytes);
    if (bytes > 0 && !buf) return rt_fail(err, RT_ERR_ARG, "%s: a NULL buffer", what);
    double t0 = rt_comm_now();
    RtStatus st = c->ops->broadcast(c, buf, bytes, root, err);
    if (st == RT_OK) rt_comm_count(c, RT_COMM_BROADCAST, t0, c->rank == root ? bytes * (c->size - 1) : 0);
    return st;
}

RtStatus rt_comm_barrier(RtComm *c, RtError *err) {
    double t0 = rt_comm_now();
    RtStatus st = c->ops->barrier(c, err);
    if (st == RT_OK) rt_comm_count(c, RT_COMM_BARRIER, t0, 0);
    return st;
}

RtStatus rt_comm_timeout_env(double *timeout_s, RtError *err) {
    const char *v = getenv("MBT_COMM_TIMEOUT");
    *timeout_s = RT_COMM_TIMEOUT_DEFAULT;
    if (!v || !*v) return RT_OK;
    char *end;
    double t = strtod(v, &end);
    if (end == v || *end || !(t > 0) || t > 1e9)
        return rt_fail(err, RT_ERR_ARG, "MBT_COMM_TIMEOUT is '%.40s': it must be a number of seconds above 0", v);
    *timeout_s = t;
    return RT_OK;
}

void rt_comm_shards(int64_t n, int size, int64_t align, int64_t *off) {
    if (size < 1) size = 1;
    if (align < 1) align = 1;
    if (n < 0) n = 0;
    /* each shard ceil(n / size) rounded up to align; the last ones take what is left (maybe
     * nothing), so every boundary but off[size] is a multiple of align */
    int64_t per = (n + size - 1) / size;
    per = (per + align - 1) / align * align;
    for (int j = 0; j <= size; j++) {
        int64_t b = per * j;
        off[j] = j == size || b > n ? n : b;
    }
}

/* ---- MBT_DEBUG -------------------------------------------------------------------------------- */

void rt_comm_print_timing(FILE *f, const RtComm *c) {
    if (!c || !c->debug) return;
    int64_t calls = 0;
    for (int i = 0; i < RT_COMM_NOPS; i++) calls += c->stat[i].calls;
    if (calls == 0) return;
    /* built whole and written at once, so that ranks sharing a terminal interleave whole tables */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return;
    char pre[32] = "";
    if (c->size > 1) snprintf(pre, sizeof pre, "[rank %d] ", c->rank);
    fprintf(m, "%scollectives: rank %d of %d, %s, timeout %g s\n", pre, c->rank, c->size, c->backend, c->timeout);
    fprintf(m, "%s  %-16s %8s %12s %11s %10s %10s\n", pre, "collective", "calls", "MB sent", "total ms", "mean ms", "max ms");
    for (int i = 0; i < RT_COMM_NOPS; i++) {
        const RtCommStat *s = &c->stat[i];
        if (!s->calls) continue;
        fprintf(m, "%s  %-16s %8" PRId64 " %12.3f %11.3f %10.3f %10.3f\n", pre, rt_comm_op_names[i], s->calls, s->bytes / 1e6,
                1e3 * s->total, 1e3 * s->total / (double)s->calls, 1e3 * s->max);
    }
    fclose(m);
    fwrite(text, 1, len, f);
    fflush(f);
    free(text);
}
