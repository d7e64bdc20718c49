/* host_abi.h - the byte layout of the runtime's ABI structs (runtime/rt_program.h) as the C
 * compiler that built mbtc lays them out: host_abi.c includes the runtime header and reports
 * offsetof / sizeof, and builders.c checks LLVM's layout of the same structs against them before
 * emitting code that reads an RtStep or defines the `mbt_program` descriptor. Both follow the
 * structs' field lists (runtime/rt_program_fields.h). */
#ifndef MBT_HOST_ABI_H
#define MBT_HOST_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef enum HostAbiStruct {
    HA_STEP,
    HA_PARAM,
    HA_TRAIN,
    HA_GENERATE,
    HA_PROGRAM,
    HA_RAMP,
    HA_GPU_IMAGE,
    HA_GPU_KERNEL,
    HA_GPU_PROGRAM,
    HA_PLAN_INFO,
    HA_KV_INFO,
    HA_COUNT
} HostAbiStruct;

/* The struct's size and its fields' offsets in declaration order (*nfields of them). */
const int64_t *host_abi_layout(HostAbiStruct s, int *nfields, int64_t *size);
const char *host_abi_name(HostAbiStruct s); /* "RtStep" ... */
int host_abi_version(void);                 /* RT_ABI_VERSION */
int host_abi_max_rank(void);                /* RT_ST_MAX_RANK */
int host_abi_phases(void);                  /* RT_NPHASES */
int host_abi_gemm_epilogue(int fe);         /* FuseEpilogue's FE_* as RtGemmEpilogue's RT_GEMM_* */

/* The runtime's checksum (rt_checksum: XXH3-128) of n bytes, as 32 lowercase hex digits and a NUL. */
#define HOST_ABI_CHECKSUM_CHARS 32
void host_abi_checksum(const void *data, size_t n, char out[HOST_ABI_CHECKSUM_CHARS + 1]);

#endif
