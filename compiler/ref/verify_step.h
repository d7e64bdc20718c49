/* verify_step.h - `mbtc --verify-step`: a compiled program's dumped step (weights, batches, loss,
 * gradients) against the reference evaluator in double precision (verify_step.c). */
#ifndef MBT_VERIFY_STEP_H
#define MBT_VERIFY_STEP_H

#include "arena.h"
#include "module.h"

/* Rebuilds the train block `train` (NULL: the first), evaluates its step on the dump's weights and
 * batches with ref_run, prints the loss and every gradient's relative error, and returns the exit
 * status: 0 within tolerance, 1 over it or on an error (reported). */
int verify_step(Loader *ld, Module *main_mod, const char *train, const char *path, Arena *ar);

#endif
