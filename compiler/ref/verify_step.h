/* verify_step.h - `mbtc --verify-step`: a compiled program's dumped step (weights, batches, loss,
 * gradients) against the reference evaluator in double precision (verify_step.c). */
#ifndef MBT_VERIFY_STEP_H
#define MBT_VERIFY_STEP_H

#include "pipeline.h"

/* Runs the stage table p (its goal ST_UPDATE; --train picks the block) up to the train block's
 * differentiated step and its update graph, evaluates the step on the dump's weights and
 * batches with ref_run, prints the loss and every gradient's relative error, and returns the exit
 * status: 0 within tolerance, 1 over it or on an error (reported). */
int verify_step(Pipeline *p, const char *path);

#endif
