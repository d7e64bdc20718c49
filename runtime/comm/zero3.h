/* zero3.h - ZeRO-3's parameter region (docs/parallel.md, "ZeRO-3"): a rank keeps its shard of the
 * parameters resident, and the rest of each range the step reads is gathered from the other ranks
 * before the step's launches read it and released after (the plan's schedule, plan.h PlanGather,
 * which the CPU's and the GPU's forward_backward signal through rt_param_need and rt_param_done).
 * The next gather runs on a thread of its own while the launches use the ones before it (on the
 * GPU: on a stream of its own, rt_zero3_open_gpu below).
 *
 * The region is one anonymous mapping of the parameter region's size, at the addresses the
 * program uses, so the generated code reads it exactly as without ZeRO. Each page counts the
 * gathers that hold a float of it (from the gather's start to its release); releasing a range
 * gives back, by madvise(MADV_DONTNEED), its pages that no gather holds any more and that hold
 * nothing of the rank's shard (a page shared with a neighbour still held stays until that one is
 * released). What is resident is measured with mincore() around each gather and release
 * (rt_zero3_high_water). */
#ifndef MBT_ZERO3_H
#define MBT_ZERO3_H

#include <stdint.h>

#include "comm.h"
#include "rt_gpu.h"
#include "rt_program.h"

typedef struct RtZero3 RtZero3;

/* Takes over the parameter region *params of n floats (freeing it: *params becomes the new
 * mapping, with the same contents) for rank `rank` of c, whose shard is [off[rank], off[rank + 1])
 * (off: size + 1 boundaries, kept by the caller). Everything is resident until the first release. */
RtStatus rt_zero3_open(RtZero3 **out, RtComm *c, float **params, int64_t n, const int64_t *off, RtError *err);
/* The same on the GPU (docs/parallel.md, "ZeRO-3 on the GPU"): the device's region *d_params (n
 * floats, freed) becomes a reservation at fixed addresses (gpu_vmm.c) whose pages of this rank's
 * shard are mapped for good and uploaded from `host` (the host's copy, whole, kept by the caller);
 * the rest is mapped around the uses. The gathers go GPU to GPU when c has NCCL (rt_comm_nccl),
 * else through `host`; each is queued on the region's stream, which the compute stream waits for
 * (an event), gather k + 1 issued at gather k's need; a release unmaps once the launches queued
 * before it are done. rt_zero3_whole then maps and fills the whole device region and makes `host`
 * whole; rt_zero3_release_all waits for the GPU. MBT_TEST_ZERO3_RELEASE_EARLY=1 (a test's broken
 * schedule) unmaps each gather's pages right after its data lands, before the launches that read
 * them. */
RtStatus rt_zero3_open_gpu(RtZero3 **out, RtComm *c, RtGpu *g, float *host, float **d_params, int64_t n, const int64_t *off,
                           RtError *err);
int rt_zero3_on_gpu(const RtZero3 *z);
int64_t rt_zero3_page(const RtZero3 *z); /* the region's page: the OS's, or the GPU's allocation granularity */
/* Waits for a gather in flight, stops the thread and unmaps the region (*params = NULL; on the GPU
 * the device's region, the d_params given to rt_zero3_open_gpu). */
void rt_zero3_close(RtZero3 *z, float **params);
/* forward_backward's hook (RtStep.param_hook points at it). */
const RtParamHook *rt_zero3_hook(RtZero3 *z);
/* After a forward_backward: waits for a gather still in flight (one was, only when the call
 * failed) and returns the first failure of the hook's gathers, or RT_OK; the state is then ready
 * for the next call. */
RtStatus rt_zero3_settle(RtZero3 *z, RtError *err);
/* The whole region gathered (every rank takes part): before what reads the parameters whole
 * (evaluation, a checkpoint, --save-weights, --dump-step). */
RtStatus rt_zero3_whole(RtZero3 *z, RtError *err);
/* Everything outside the rank's shard released (after rt_zero3_whole, before a step). */
void rt_zero3_release_all(RtZero3 *z);
/* Bytes of the region resident now (mincore), and the most measured during the calls with the
 * hook since the last reset (sampled after each gather and before each release). */
int64_t rt_zero3_resident(RtZero3 *z);
int64_t rt_zero3_high_water(const RtZero3 *z);
void rt_zero3_reset_high_water(RtZero3 *z);
/* The gathers the hook ran, the floats they moved into this rank, the seconds the step waited for
 * them (a need whose gather had not finished) and the seconds the thread spent in them. */
void rt_zero3_stats(const RtZero3 *z, int64_t *gathers, int64_t *floats, double *waited_s, double *gather_s);

#endif
