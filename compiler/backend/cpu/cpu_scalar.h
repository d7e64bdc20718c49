/* cpu_scalar.h - a scalar program (scalar.h) lowered to an LLVM function of the step.
 *
 * Pipeline position: sema (the learning-rate schedule lowered to a scalar program) ->
 * [cpu_scalar] -> host code (the executable's lr_schedule, called once per optimizer step). */
#ifndef MBT_CPU_SCALAR_H
#define MBT_CPU_SCALAR_H

#include <llvm-c/Core.h>

#include "scalar.h"

/* Adds `double NAME(int64_t step)` with internal linkage to m, computing p: every number a
 * double, bools i1, each instruction the LLVM operation of the same meaning and no fast-math
 * flags (so its results are those of the C doubles: cos, exp, pow ... are llvm.cos, llvm.exp,
 * llvm.pow, min/max llvm.minimum/maximum, mod frem, int() llvm.trunc). p must pass
 * scalar_verify. */
LLVMValueRef cpu_scalar_function(LLVMModuleRef m, const ScalarProg *p, const char *name);

#endif
