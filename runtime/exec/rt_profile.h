/* rt_profile.h - an opt-in profile of a training run: where a step's wall time goes (MBT_PROFILE=1;
 * docs/runtime.md, "Profiling").
 *
 * Pipeline position: beside the thread pool. rt_cmd_train (train.c) creates an RtProfile when the
 * environment asks for one and attaches it to the run's pool; rt_sgemm_batched (blas.c) then adds
 * its wall time and FLOPs, rt_parallel_for (pool.c) the wall time of the parallel loops outside
 * GEMMs (the generated kernels, the gradient norm and zeroing), and the train loop marks the end
 * of each phase of a step. After the run, rt_profile_print says how much of the step time was
 * spent in GEMMs (the "GEMM share"), in pooled kernels and in serial code, per phase, and which
 * GEMM shapes took the longest.
 *
 * Cost. Without a profile attached every hook is one NULL test of the pool's pointer; with one,
 * two clock reads per GEMM and per parallel loop. Timed regions do not nest: a parallel loop run
 * by a GEMM counts as GEMM time only.
 *
 * Threads. The counters are plain fields written by the thread that drives the pool (the train
 * loop's thread, which runs the generated host code and calls the GEMMs); the pool's workers only
 * read `depth`, which is written before a job is published and after it is joined. */
#ifndef MBT_RT_PROFILE_H
#define MBT_RT_PROFILE_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "rt_program.h"

/* The phases of an optimizer step, in the order the train loop runs them. */
typedef enum RtProfilePhase {
    RT_PROF_DATA,   /* the learning rate, reading the micro-batch */
    RT_PROF_FB,     /* forward_backward (generated code) */
    RT_PROF_NORM,   /* the gradient's global norm and clipping */
    RT_PROF_UPDATE, /* optimizer_update (generated code) */
    RT_PROF_ZERO,   /* zeroing the gradients */
    RT_PROF_LOG,    /* the log line, evaluation */
    RT_PROF_NPHASES
} RtProfilePhase;

#define RT_PROFILE_SHAPES 64 /* distinct GEMM shapes kept; more are counted under "other shapes" */

typedef struct RtProfileGemm {
    int trans_a, trans_b;
    int64_t m, n, k, batch;
    int64_t calls;
    double s;
} RtProfileGemm;

typedef struct RtProfile {
    int depth;      /* > 0 inside a timed GEMM or parallel loop (nested calls are not timed) */
    double gemm_t0; /* when the timed GEMM at depth 1 started (blas.c) */
    /* running totals */
    double gemm_s;    /* wall time inside rt_sgemm_batched */
    double gemm_flop; /* 2 m n k batch per call */
    int64_t gemm_calls;
    double pool_s; /* wall time inside rt_parallel_for, outside GEMMs */
    int64_t pool_calls;
    /* per phase: wall time, and the GEMM and pool time within it */
    double phase_s[RT_PROF_NPHASES], phase_gemm_s[RT_PROF_NPHASES], phase_pool_s[RT_PROF_NPHASES];
    double mark_t, mark_gemm_s, mark_pool_s; /* the totals at the last phase mark */
    int64_t steps;                           /* steps profiled */
    int skipped_first;                       /* the first step (warm-up) was left out */
    RtProfileGemm shapes[RT_PROFILE_SHAPES];
    int nshapes;
    RtProfileGemm other; /* shapes beyond RT_PROFILE_SHAPES */
} RtProfile;

/* Monotonic seconds (the profile's clock). */
static inline double rt_profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rt_profile_requested(void);                       /* MBT_PROFILE is set and not "" or "0" */
void rt_profile_reset(RtProfile *p);                  /* all counters to zero (the train loop: after step 1) */
void rt_pool_set_profile(RtPool *pool, RtProfile *p); /* attach (NULL: detach); pool.c */
RtProfile *rt_pool_profile(const RtPool *pool);       /* the attached profile or NULL; pool.c */
void rt_profile_gemm(RtProfile *p, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, int64_t batch,
                     double seconds);                            /* one GEMM call (blas.c) */
void rt_profile_begin_step(RtProfile *p);                        /* marks the start of a step */
void rt_profile_phase(RtProfile *p, RtProfilePhase ph);          /* the phase since the last mark ends now */
void rt_profile_print(FILE *f, const RtProfile *p, int threads); /* the report (after the run) */

#endif
