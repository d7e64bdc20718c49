/* cpu.h - the CPU back end: kernel IR (kir.h) -> LLVM IR functions for the host, optimised with
 * LLVM's new pass manager and written to an object file. LLVM 19 through its C API only.
 *
 * Pipeline position: fuse -> kir -> [cpu] (and, beside it, cuda) ; the step program's host code
 * (compiler/host, next) calls the functions made here through the runtime's thread pool.
 *
 * The ABI of a generated kernel (one LLVM function per Kernel, named after Kernel.name):
 *
 *     void NAME(void **bufs, int64_t gid_begin, int64_t gid_end);
 *
 *   - bufs[i] is the base address of the kernel's buffer parameter i (Kernel.bufs[i]), a dense
 *     row-major array of its element type: f32 `float`, f64 `double`, i32 `int32_t`, i64
 *     `int64_t`, bool one byte (0 or 1), f16 IEEE binary16 and bf16 bfloat16 as their 16 bits.
 *     Any alignment of the element type will do. Buffers may overlap (an update written in
 *     place over its input) unless the kernel was lowered with `disjoint` (cpu_lower_kernel).
 *   - it runs work items gid_begin .. gid_end - 1 in increasing order (0 <= gid_begin <=
 *     gid_end <= Kernel.grid); work items are independent, so disjoint ranges may run on
 *     different threads at once (the runtime's rt_parallel_for splits [0, grid) that way) and
 *     the results do not depend on the split.
 *   - it cannot fail and keeps no state; it calls nothing but LLVM intrinsics and libm (tanhf,
 *     tanh, and what the intrinsics lower to: expf, logf, powf, sinf, cosf, fmodf ...).
 *
 * Numerics (what the tests hold it to, against kir_ref's double precision):
 *   - f32 and f64 values are LLVM float/double, computed without fast-math flags: IEEE operations
 *     in the order the KIR gives: a reduction loop sums in exactly its KIR order, and vector code
 *     (the vectoriser never reassociates) computes every value exactly as the scalar code would.
 *   - f16 and bf16 values are computed in f32. Loads extend exactly; stores and casts to f16/bf16
 *     round to nearest, ties to even (f16: LLVM's fptrunc to `half`; bf16: integer rounding on
 *     the f32 bits, NaN kept quiet) - so between two stores an f16 value carries f32 precision.
 *   - max/min propagate NaN (llvm.maximum/minimum: NaN if either is NaN, -0 < +0).
 *   - mod is NumPy's remainder: the sign of the divisor; float x mod 0 is NaN, integer 0.
 *     Integer div is NumPy's floor division, x // 0 = 0; idiv/imod (index arithmetic) are C's.
 *   - float -> integer casts truncate and saturate (NaN -> 0); float -> bool is x != 0.
 *   - u64 add/mul/sub wrap; shr by 64 or more is 0 (dropout's Philox rounds).
 *
 * Errors: a malformed kernel, or LLVM rejecting the IR built here, is an internal error (a compiler
 * bug). What can fail for other reasons (no target for the host, an unwritable output file)
 * returns nonzero with a message in *err saying what was being done, for the caller to report. */
#ifndef MBT_CPU_H
#define MBT_CPU_H

#include <stdio.h>

#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "arena.h"
#include "kir.h"

/* The machine the code is for: the host, its CPU and features (vectorisation uses them). */
typedef struct CpuTarget {
    LLVMTargetMachineRef tm;
    const char *triple;   /* normalised: "x86_64-pc-linux-gnu" */
    const char *cpu;      /* "znver3", "skylake" ... */
    const char *features; /* "+avx2,+fma,-avx512f,..." */
    const char *layout;   /* the data layout string */
} CpuTarget;

/* Initialises LLVM's native target (LLVM's own once-only setup) and makes a target machine for
 * the host CPU at -O2 with position-independent code. Returns 0, or 1 with *err (in ar). */
int cpu_target_host(CpuTarget *t, Arena *ar, const char **err);
void cpu_target_dispose(CpuTarget *t); /* the target machine (the strings live in the arena) */

/* An empty module in ctx with the target's triple and data layout (the loads and stores built
 * later take their alignment from it). */
LLVMModuleRef cpu_module_new(LLVMContextRef ctx, const CpuTarget *t, const char *name);

/* Adds `void NAME(ptr bufs, i64 gid_begin, i64 gid_end)` computing the kernel to m and returns
 * it. The kernel must pass kir_verify (else an internal error); the function is verified.
 * disjoint = 1 is the caller's promise that parameters bound to different schedule buffers
 * (KBuf.buffer) share no byte during a call (true of distinct activations; false when the memory
 * plan writes a result over an input, in place): every load and store then carries alias-scope
 * metadata saying so, which lets LLVM vectorise loops whose indices it cannot bound (broadcasts:
 * `gid % n`). disjoint = 0 assumes nothing (LLVM checks overlaps at run time where it can). */
LLVMValueRef cpu_lower_kernel(LLVMModuleRef m, const Kernel *k, int disjoint);

/* LLVMVerifyModule: returns 0, or 1 with LLVM's report in *err. */
int cpu_verify(LLVMModuleRef m, Arena *ar, const char **err);

/* The new pass manager's default<O2> pipeline for the target (loop and SLP vectorisation and
 * unrolling on), then LLVMVerifyModule. Returns 0, or 1 with *err. */
int cpu_optimize(LLVMModuleRef m, const CpuTarget *t, Arena *ar, const char **err);

/* Writes m as an object file (ELF on Linux) to path. Returns 0, or 1 with *err. */
int cpu_emit_object(LLVMModuleRef m, const CpuTarget *t, const char *path, Arena *ar, const char **err);

/* `mbtc --emit=llvm`: the module's text, each kernel's function preceded by `;` comment lines:
 * the kernel's name, kind, grid and buffers, notes[i] when given (the fused ops and their source
 * lines, one per line), and its KIR body, so a reader can match %N in the KIR with the LLVM
 * values named after it (`%add12`, `%load7`, `%i4` for loop counters, `%acc3` for accumulators). */
/* A comment cpu_print_module writes above every call containing `needle` (a launch in host code). */
typedef struct CpuAnnotation {
    const char *needle, *comment;
} CpuAnnotation;
void cpu_print_module(FILE *out, LLVMModuleRef m, Kernel *const *kernels, const char *const *notes, int nkernels,
                      const CpuAnnotation *ann, int nann);

#endif
