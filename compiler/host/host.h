/* host.h - the host code of an executable: `mbtc prog.mbt -o prog`.
 *
 * Pipeline position: plan -> fuse -> cpu (kernels) -> [host] -> object file -> link with libmbtrt.
 * host_compile builds, from the stages before it (compiler/pipeline.c), one LLVM module holding
 * every kernel of the step schedule (prefix step_), of the update schedule (update_) and of
 * generation's forward at batch 1 (logits_), the RtProgram functions that launch them
 * (forward_backward, forward_loss, forward_logits, optimizer_update, lr_schedule) and the
 * `mbt_program` descriptor (runtime/rt_program.h), whose struct layouts are checked against the C
 * compiler's (host_abi.h); then it writes the object and links the executable. A program whose
 * model's output is not [B, T, vocab] logits of a causal model compiles with a warning and
 * forward_logits NULL.
 *
 * A batch-size ramp (one plan step program per stage) is one forward_backward - micro and T do not
 * change - and a ramp table in the descriptor (RtRampStage) from which the runtime takes each
 * step's accumulation and loss_scale. The backward is seeded with 1.0 and the gradients are added
 * into the gradient region scaled by loss_scale afterwards.
 *
 * Every function is emitted once per target from one emitter: the CPU's (the thread pool,
 * rt_sgemm_batched / rt_bgemm_batched) and, when the executable has a CUDA side, the GPU's
 * (rt_gpu_launch, rt_gpu_sgemm_batched / rt_gpu_bgemm_batched ...); host_internal.h lists the files. */
#ifndef MBT_HOST_H
#define MBT_HOST_H

#include "cpu.h"
#include "fuse.h"
#include "module.h"
#include "plan.h"

/* The CUDA side -o builds into the executable: a cubin for each architecture ("sm_80") and the PTX
 * of the highest; narch 0 builds for the CPU alone. */
typedef struct HostCuda {
    const char *const *archs;
    int narch;
} HostCuda;

/* Refuses a step -o cannot compile yet (settings executables do not carry out): returns 1
 * after reporting the error, else 0. Called before the schedules are built. */
int host_refuses(const TrainBuild *tb, int narch); /* narch: the build's CUDA archs (0: the CPU alone) */
/* The schedules -o builds (plan.h, PlanSchedules: the fused step, update and batch-1 logits the
 * memory plan is of), for the host code and the CUDA program. */
typedef PlanSchedules HostSchedules;
/* The plan's schedules with every kernel named with its schedule's prefix (step_k3_add; in place:
 * call once, after the stages that print the kernels' own names), and -o's warning when the
 * program has no logits. Returns 0, or 1 after errors were reported through diag. */
int host_schedules(const Plan *plan, HostSchedules *out, Arena *ar);
/* Builds the executable for tb (its step differentiated) from its plan and schedules
 * (host_schedules) at `output`; with output NULL, prints the program's whole LLVM module to emit
 * instead (--emit=program: the GPU functions too, without the compiled images). input names the
 * module. Returns the exit status (errors reported through diag). Without NVRTC the executable is
 * built for the CPU alone, with a warning. */
int host_compile(const TrainBuild *tb, const Plan *plan, const HostSchedules *schedules, const char *input, const char *output,
                 FILE *emit, const HostCuda *cuda, Arena *ar);
#endif
