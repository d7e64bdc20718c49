/* kir_ref.h - the kernel IR interpreter: runs kernels and whole schedules in double precision.
 *
 * Pipeline position: beside the back ends: an oracle, not a stage of what -o builds (like ref.h). It is how the tests
 * hold every fused kernel to the unfused graph: run the schedule fuse_graph made (GEMMs by a naive
 * triple loop, kernels instruction by instruction) and compare each buffer with what ref_run
 * computes for the node it holds. Plain C, no tricks: every float is a double, integers and bools
 * are held in buffers as whole numbers, as in ref.c. */
#ifndef MBT_KIR_REF_H
#define MBT_KIR_REF_H

#include "fuse.h"

/* Runs every work item of kernel k. bufs[i] holds the elements of its parameter i. Returns 0, or
 * -1 after reporting (diag_error_noloc) a load or store outside its buffer. */
int kir_ref_kernel(const Kernel *k, double *const *bufs);

/* One GEMM launch; bufs is indexed by the schedule's buffer numbers (m->a, m->b, m->c, m->bias). */
void kir_ref_gemm(const FuseGemm *m, double *const *bufs);

/* Runs the launches of r in order. Every buffer is allocated in ar: leaves are copied from
 * leaves[graph node id] (a parameter given no values and initialised by zeros, ones or a
 * constant is filled from its initialiser, as ref_run does); everything else starts as NaN, so a
 * value read before it is written shows. Returns the buffers by index, or NULL after an error. */
double **kir_ref_schedule(const FuseResult *r, double *const *leaves, Arena *ar);

#endif
