/* step_dump.h - reads a step dump (`PROG train --dump-step`, runtime/rt_exec.h's rt_step_dump)
 * for a train block's step graph: its metadata checked, its tensors read (step_dump.c). Used by
 * `mbtc --verify-step` (verify_step.c) and fuzzed on its own (tests/fuzz/fuzz_verify_step.c):
 * it needs the step graph only, not the stage table or LLVM. */
#ifndef MBT_STEP_DUMP_H
#define MBT_STEP_DUMP_H

#include <stdint.h>

#include "arena.h"
#include "graph.h"
#include "rt.h"

typedef struct StepDump {
    int64_t micro, accum, seq; /* mbt.micro, mbt.accum, mbt.seq (micro x seq: the graph's data.x) */
    int64_t rows, cells;       /* micro x accum rows of seq tokens: the batches' sizes */
    double loss, lr, clip;     /* mbt.loss, mbt.lr, mbt.clip */
    int xin, yin;              /* the step graph's data.x and data.y inputs */
    int rngin;                 /* its dropout key "rng" (graph.h), or -1: no dropout */
    uint64_t seed;             /* mbt.seed: the run's seed (read when rngin >= 0) */
    double **leaves;           /* [g->n]: at each parameter's node id, its dumped weights */
    double **grad, **next;     /* [g->nparams]: the dumped gradients and updated parameters */
    int32_t *bx, *by;          /* [cells]: the step's token batches (malloc'd; step_dump_free) */
} StepDump;

/* Checks the dump f (opened from `path`, which the messages name) against the step graph g and
 * reads it into *d (the arrays in ar, the batches malloc'd). Returns 0, or 1 after reporting every
 * problem found (diag_error_noloc); step_dump_free is then still called. Never reads past a tensor
 * or the file, whatever the metadata say. */
int step_dump_read(const Graph *g, const RtStFile *f, const char *path, StepDump *d, Arena *ar);
void step_dump_free(StepDump *d);

#endif
