/* host.h - the host code of an executable: `mbtc prog.mbt -o prog`.
 *
 * Pipeline position: plan -> fuse -> cpu (kernels) -> [host] -> object file -> link with libmbtrt.
 * host_build_program emits one LLVM module holding every kernel of the step schedule (prefix
 * step_), of the update schedule (update_) and of generation's forward at batch 1 (logits_), the
 * RtProgram functions that launch them (forward_backward, forward_loss, forward_logits,
 * optimizer_update, lr_schedule) and the `mbt_program` descriptor (runtime/rt_program.h), whose
 * struct layouts are checked against the C compiler's (host_abi.h). host_compile runs the whole
 * pipeline, writes the object and links the executable. A program whose model's output is not
 * [B, T, vocab] logits of a causal model compiles with a warning and forward_logits NULL.
 *
 * A batch-size ramp (one plan step program per stage) is one forward_backward - micro and T do not
 * change - and a ramp table in the descriptor (RtRampStage) from which the runtime takes each
 * step's accumulation and loss_scale.
 *
 * What it does not do yet: only f32 GEMMs;
 * the backward is seeded with 1.0 and the gradients are added into the gradient region scaled by
 * loss_scale afterwards. */
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

/* Builds the executable for the train block of main_mod named train_name (NULL: the first) at
 * `output`; with output NULL, prints the program's whole LLVM module instead (--emit=program: the
 * GPU functions too, without the compiled images). Returns the exit status (errors reported through
 * diag; an unknown name is one, listing the file's train blocks). Without NVRTC the executable is
 * built for the CPU alone, with a warning. */
int host_compile(Loader *ld, Module *main_mod, const char *input, const char *train_name, const char *output,
                 const HostCuda *cuda, Arena *ar);

/* The schedules -o builds, fused and verified (plan.h, PlanSchedules), for back ends that lower
 * them elsewhere (the CUDA source of --emit=cuda), with -o's warning when there are no logits. */
typedef PlanSchedules HostSchedules;
/* Returns 0, or 1 after errors were reported through diag. */
int host_schedules(Loader *ld, Module *main_mod, const char *train_name, HostSchedules *out, Arena *ar);

#endif
