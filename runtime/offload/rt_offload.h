/* rt_offload.h - optimizer-state offload to the NVMe store (opt_offload.c; docs/memory.md,
 * "Optimizer-state offload").
 *
 * Pipeline position: inside the train loop's update (runtime/cli/train.c). With
 * `offload { optimizer = nvme }` the optimizer state (AdamW's m and v: RtProgram.nstate variables
 * of rt_state_part elements) lives in a store file rather than in memory. The state is cut into
 * chunks of RtTrainSettings.offload_chunk parameters (the compiler's plan); chunk c's variables lie
 * together in slot c of the file, in the layout optimizer_update takes over the range [lo, hi) (each
 * variable's [lo, hi) in turn). An optimizer step then runs optimizer_update once a chunk, through
 * three staging buffers: chunk c + 1 is read and chunk c - 1 written back while chunk c is updated.
 * Each chunk is the same elementwise arithmetic on the same elements as the whole update, so a run
 * is bit for bit the run without offload. */
#ifndef MBT_RT_OFFLOAD_H
#define MBT_RT_OFFLOAD_H

#include "rt_exec.h"

typedef struct RtOptOffload RtOptOffload;

/* Opens the store DIR/NAME for p's state and fills it from `state` (the whole state region's
 * layout, nstate parts of rt_state_part), or leaves it zero when state is NULL. */
RtStatus rt_opt_offload_open(RtOptOffload **out, const RtProgram *p, const char *dir, const char *name, const float *state,
                             RtError *err);
/* One optimizer step over the whole state: *s as for optimizer_update (lr, t, step, seed, the
 * regions), its state, lo and hi set here chunk by chunk; runs on the CPU: on a GPU build the CPU's
 * optimizer_update over the host copies *s names (train.c brings the gradient down first). */
RtStatus rt_opt_offload_update(RtOptOffload *o, RtExec *x, RtStep *s, RtError *err);
/* The same with hooks around each chunk's update: before(ctx, c) and after(ctx, c), chunk c the
 * parameters [c x chunk, min((c + 1) x chunk, n)) (rt_opt_offload_chunk); a failure stops the
 * update (a GPU build's host update: the chunk's gradient waited for, its parameters uploaded). */
typedef struct RtOptChunkHooks {
    RtStatus (*before)(void *ctx, int64_t c);
    RtStatus (*after)(void *ctx, int64_t c);
    void *ctx;
} RtOptChunkHooks;
RtStatus rt_opt_offload_update_chunks(RtOptOffload *o, RtExec *x, RtStep *s, const RtOptChunkHooks *hooks, RtError *err);
/* The whole state read back into state (state_floats; for a checkpoint). */
RtStatus rt_opt_offload_read(RtOptOffload *o, float *state, RtError *err);
const char *rt_opt_offload_note(const RtOptOffload *o); /* the store's note (buffered I/O, no io_uring), or "" */
const char *rt_opt_offload_path(const RtOptOffload *o); /* the store file */
int64_t rt_opt_offload_file_bytes(const RtOptOffload *o);
int64_t rt_opt_offload_staging_bytes(const RtOptOffload *o); /* the three staging buffers: the state's memory */
int64_t rt_opt_offload_nchunks(const RtOptOffload *o);
int64_t rt_opt_offload_chunk(const RtOptOffload *o);      /* parameters a chunk (the last may be shorter) */
double rt_opt_offload_wait_s(const RtOptOffload *o);      /* seconds the updates waited for the store, in all */
const char *rt_opt_offload_engine(const RtOptOffload *o); /* "io_uring, O_DIRECT" and the like */
void rt_opt_offload_close(RtOptOffload *o);               /* removes the store file (NULL is fine) */

#endif
