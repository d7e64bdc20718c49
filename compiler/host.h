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
#include "module.h"

/* Builds the executable for the train block of main_mod named train_name (NULL: the first) at
 * `output`; with output NULL, prints the program's whole LLVM module instead (--emit=program). Returns the exit status (errors reported through diag; an unknown name is one, listing
 * the file's train blocks). */
int host_compile(Loader *ld, Module *main_mod, const char *input, const char *train_name, const char *output,
                 Arena *ar);

#endif
