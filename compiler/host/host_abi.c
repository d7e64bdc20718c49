/* host_abi.c - offsetof/sizeof of the runtime's ABI structs (host_abi.h). The only compiler file
 * that includes a runtime header (-Iruntime), so the layouts come from the header itself. */
#include <stddef.h>

#include "fuse.h"
#include "host_abi.h"
#include "rt_program.h"

#define F(S, f) (int64_t)offsetof(S, f)

static const int64_t step_off[] = {F(RtStep, pool), F(RtStep, params), F(RtStep, grads), F(RtStep, state),
                                   F(RtStep, arena), F(RtStep, x), F(RtStep, y), F(RtStep, B), F(RtStep, T),
                                   F(RtStep, len), F(RtStep, logits), F(RtStep, loss_scale), F(RtStep, loss),
                                   F(RtStep, lr), F(RtStep, t), F(RtStep, step), F(RtStep, micro), F(RtStep, seed),
                                   F(RtStep, err), F(RtStep, gpu)};
static const int64_t param_off[] = {F(RtParam, name),   F(RtParam, rank), F(RtParam, shape),  F(RtParam, numel),
                                    F(RtParam, offset), F(RtParam, init), F(RtParam, init_a), F(RtParam, init_b)};
static const int64_t train_off[] = {
    F(RtTrainSettings, name),     F(RtTrainSettings, micro),  F(RtTrainSettings, seq),        F(RtTrainSettings, global),
    F(RtTrainSettings, accum),    F(RtTrainSettings, steps),  F(RtTrainSettings, seed),       F(RtTrainSettings, clip),
    F(RtTrainSettings, vocab),    F(RtTrainSettings, ctx),    F(RtTrainSettings, lr),         F(RtTrainSettings, data),
    F(RtTrainSettings, val_data), F(RtTrainSettings, shuffle), F(RtTrainSettings, eval_every), F(RtTrainSettings, eval_steps),
    F(RtTrainSettings, data_ranks), F(RtTrainSettings, nramp),  F(RtTrainSettings, ramp),
    F(RtTrainSettings, ckpt_every), F(RtTrainSettings, ckpt_dir), F(RtTrainSettings, ckpt_keep),
    F(RtTrainSettings, ckpt_continue_on_error)};
static const int64_t ramp_off[] = {F(RtRampStage, step), F(RtRampStage, global), F(RtRampStage, accum)};
static const int64_t gen_off[] = {F(RtGenerateSettings, weights), F(RtGenerateSettings, temperature),
                                  F(RtGenerateSettings, top_k), F(RtGenerateSettings, max_tokens)};
static const int64_t prog_off[] = {
    F(RtProgram, abi_version),  F(RtProgram, source),           F(RtProgram, train),          F(RtProgram, generate),
    F(RtProgram, params),       F(RtProgram, nparams),          F(RtProgram, param_floats),   F(RtProgram, state_floats),
    F(RtProgram, arena_bytes),  F(RtProgram, logits_seq),       F(RtProgram, forward_backward), F(RtProgram, forward_loss),
    F(RtProgram, forward_logits), F(RtProgram, optimizer_init), F(RtProgram, optimizer_update), F(RtProgram, lr_schedule),
    F(RtProgram, hash),         F(RtProgram, nstate),           F(RtProgram, state_names),    F(RtProgram, gpu),
    F(RtProgram, plan)};
static const int64_t plan_info_off[] = {F(RtPlanInfo, arena), F(RtPlanInfo, kernels), F(RtPlanInfo, gemms),
                                        F(RtPlanInfo, input_bytes)};
static const int64_t gpu_image_off[] = {F(RtGpuImage, arch), F(RtGpuImage, ptx), F(RtGpuImage, data), F(RtGpuImage, size)};
static const int64_t gpu_kernel_off[] = {F(RtGpuKernel, function), F(RtGpuKernel, block), F(RtGpuKernel, shared),
                                         F(RtGpuKernel, blocks), F(RtGpuKernel, nbufs)};
static const int64_t gpu_prog_off[] = {F(RtGpuProgram, images),          F(RtGpuProgram, nimages),
                                       F(RtGpuProgram, kernels),         F(RtGpuProgram, nkernels),
                                       F(RtGpuProgram, module_hash),     F(RtGpuProgram, forward_backward),
                                       F(RtGpuProgram, forward_loss),    F(RtGpuProgram, forward_logits),
                                       F(RtGpuProgram, optimizer_update)};

#define N(a) (int)(sizeof a / sizeof *a)

const int64_t *host_abi_layout(HostAbiStruct s, int *nfields, int64_t *size) {
    switch (s) {
    case HA_STEP: *nfields = N(step_off), *size = sizeof(RtStep); return step_off;
    case HA_PARAM: *nfields = N(param_off), *size = sizeof(RtParam); return param_off;
    case HA_TRAIN: *nfields = N(train_off), *size = sizeof(RtTrainSettings); return train_off;
    case HA_GENERATE: *nfields = N(gen_off), *size = sizeof(RtGenerateSettings); return gen_off;
    case HA_RAMP: *nfields = N(ramp_off), *size = sizeof(RtRampStage); return ramp_off;
    case HA_GPU_IMAGE: *nfields = N(gpu_image_off), *size = sizeof(RtGpuImage); return gpu_image_off;
    case HA_GPU_KERNEL: *nfields = N(gpu_kernel_off), *size = sizeof(RtGpuKernel); return gpu_kernel_off;
    case HA_GPU_PROGRAM: *nfields = N(gpu_prog_off), *size = sizeof(RtGpuProgram); return gpu_prog_off;
    case HA_PLAN_INFO: *nfields = N(plan_info_off), *size = sizeof(RtPlanInfo); return plan_info_off;
    default: *nfields = N(prog_off), *size = sizeof(RtProgram); return prog_off;
    }
}

const char *host_abi_name(HostAbiStruct s) {
    static const char *const names[] = {"RtStep", "RtParam", "RtTrainSettings", "RtGenerateSettings", "RtProgram",
                                        "RtRampStage", "RtGpuImage", "RtGpuKernel", "RtGpuProgram", "RtPlanInfo"};
    return s < HA_COUNT ? names[s] : "?";
}

int host_abi_version(void) { return RT_ABI_VERSION; }
int host_abi_gemm_epilogue(int fe) { return fe == FE_BIAS ? RT_GEMM_BIAS : fe == FE_BGRAD_B ? RT_GEMM_BGRAD_B : RT_GEMM_PLAIN; }
int host_abi_max_rank(void) { return RT_ST_MAX_RANK; }
int host_abi_phases(void) { return RT_NPHASES; }

void host_abi_checksum(const void *data, size_t n, char out[HOST_ABI_CHECKSUM_CHARS + 1]) {
    _Static_assert(HOST_ABI_CHECKSUM_CHARS + 1 == RT_CHECKSUM_CHARS, "the compiler and the runtime agree on the checksum's length");
    rt_checksum(data, n, out);
}
