/* host_abi.c - offsetof/sizeof of the runtime's ABI structs (host_abi.h). The only compiler file
 * that includes rt_program.h (-Iruntime), so the layouts come from the header itself; the fields
 * are those of the lists in rt_program_fields.h, which the host code's LLVM types follow too. */
#include <stddef.h>

#include "fuse.h"
#include "host_abi.h"
#include "plan.h"
#include "rt_program.h"

/* The plan lays regions and the arena out at the alignment the runtime allocates them with. */
_Static_assert(PLAN_ALIGN == RT_ALIGN, "compiler/plan/plan.h and runtime/rt_program.h agree on the alignment");

/* Each struct's field offsets, from its field list (rt_program_fields.h) in declaration order. */
#define OFFSETS(S, LIST) LIST(S##_OFFSET)
#define RtStep_OFFSET(ctype, f, kind) (int64_t)offsetof(RtStep, f),
#define RtParam_OFFSET(ctype, f, kind) (int64_t)offsetof(RtParam, f),
#define RtTrainSettings_OFFSET(ctype, f, kind) (int64_t)offsetof(RtTrainSettings, f),
#define RtRampStage_OFFSET(ctype, f, kind) (int64_t)offsetof(RtRampStage, f),
#define RtGenerateSettings_OFFSET(ctype, f, kind) (int64_t)offsetof(RtGenerateSettings, f),
#define RtProgram_OFFSET(ctype, f, kind) (int64_t)offsetof(RtProgram, f),
#define RtGpuImage_OFFSET(ctype, f, kind) (int64_t)offsetof(RtGpuImage, f),
#define RtGpuKernel_OFFSET(ctype, f, kind) (int64_t)offsetof(RtGpuKernel, f),
#define RtGpuProgram_OFFSET(ctype, f, kind) (int64_t)offsetof(RtGpuProgram, f),
#define RtPlanInfo_OFFSET(ctype, f, kind) (int64_t)offsetof(RtPlanInfo, f),
#define RtKvInfo_OFFSET(ctype, f, kind) (int64_t)offsetof(RtKvInfo, f),

static const int64_t step_off[] = {OFFSETS(RtStep, RT_STEP_FIELDS)};
static const int64_t param_off[] = {OFFSETS(RtParam, RT_PARAM_FIELDS)};
static const int64_t train_off[] = {OFFSETS(RtTrainSettings, RT_TRAIN_FIELDS)};
static const int64_t ramp_off[] = {OFFSETS(RtRampStage, RT_RAMP_FIELDS)};
static const int64_t gen_off[] = {OFFSETS(RtGenerateSettings, RT_GEN_FIELDS)};
static const int64_t prog_off[] = {OFFSETS(RtProgram, RT_PROG_FIELDS)};
static const int64_t gpu_image_off[] = {OFFSETS(RtGpuImage, RT_GPU_IMAGE_FIELDS)};
static const int64_t gpu_kernel_off[] = {OFFSETS(RtGpuKernel, RT_GPU_KERNEL_FIELDS)};
static const int64_t gpu_prog_off[] = {OFFSETS(RtGpuProgram, RT_GPU_PROG_FIELDS)};
static const int64_t plan_info_off[] = {OFFSETS(RtPlanInfo, RT_PLAN_INFO_FIELDS)};
static const int64_t kv_info_off[] = {OFFSETS(RtKvInfo, RT_KV_INFO_FIELDS)};

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
    case HA_KV_INFO: *nfields = N(kv_info_off), *size = sizeof(RtKvInfo); return kv_info_off;
    default: *nfields = N(prog_off), *size = sizeof(RtProgram); return prog_off;
    }
}

const char *host_abi_name(HostAbiStruct s) {
    static const char *const names[] = {"RtStep",       "RtParam",     "RtTrainSettings", "RtGenerateSettings",
                                        "RtProgram",    "RtRampStage", "RtGpuImage",      "RtGpuKernel",
                                        "RtGpuProgram", "RtPlanInfo",  "RtKvInfo"};
    return s < HA_COUNT ? names[s] : "?";
}

int host_abi_version(void) { return RT_ABI_VERSION; }
int host_abi_gemm_epilogue(int fe) {
    return fe == FE_BIAS ? RT_GEMM_BIAS : fe == FE_BGRAD_B ? RT_GEMM_BGRAD_B : fe == FE_ADD ? RT_GEMM_ADD : RT_GEMM_PLAIN;
}
int host_abi_max_rank(void) { return RT_ST_MAX_RANK; }
int host_abi_phases(void) { return RT_NPHASES; }

void host_abi_checksum(const void *data, size_t n, char out[HOST_ABI_CHECKSUM_CHARS + 1]) {
    _Static_assert(HOST_ABI_CHECKSUM_CHARS + 1 == RT_CHECKSUM_CHARS,
                   "the compiler and the runtime agree on the checksum's length");
    rt_checksum(data, n, out);
}
