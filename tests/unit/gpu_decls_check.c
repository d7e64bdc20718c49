/* gpu_decls_check.c - a compile-time check (no program is built from it) that runtime/gpu_internal.h,
 * which declares the CUDA driver, cuBLASLt and NCCL types, constants and functions the runtime
 * uses without including CUDA's headers, agrees with those headers.
 *
 * Build: the Makefile compiles it with -fsyntax-only and the toolkit's include directory when
 * $(CUDA_HOME)/include/cuda.h exists (build/obj/rt/gpu_decls.ok), and skips it otherwise. With
 * RT_GPU_CHECK_DECLS defined, gpu_internal.h leaves its own declarations out and only provides
 * the tables, so that below every constant is compared with CUDA's value, every function of the
 * table is assigned to a pointer of the table's type (a different signature does not compile)
 * and the two cuBLASLt structures the runtime lays out itself are checked for size and offsets. */
#include <cuda.h>
#include <cublasLt.h>
#include <nccl.h>

#define RT_GPU_CHECK_DECLS
#include "gpu_internal.h"

#define RT_CHECK_CONSTANT(name, value) _Static_assert((long long)(name) == (value), #name " differs from CUDA's");
RT_CUDA_CONSTANTS(RT_CHECK_CONSTANT)

/* `name` expands through cuda.h's own mapping (cuMemAlloc -> cuMemAlloc_v2), so each pointer is
 * initialised with the function CUDA's header declares under that name. */
#define RT_CHECK_FUNCTION(ret, name, sym, args) __attribute__((unused)) static ret(*const rt_check_##name) args = name;
RT_CUDA_FUNCTIONS(RT_CHECK_FUNCTION)
RT_CUBLASLT_FUNCTIONS(RT_CHECK_FUNCTION)
RT_NCCL_FUNCTIONS(RT_CHECK_FUNCTION)

_Static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long), "CUdeviceptr is 64 bits");
_Static_assert(sizeof(CUdevice) == sizeof(int), "CUdevice is an int");
