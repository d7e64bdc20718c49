/* check_harness.h - what the host programs that hold one generated kernel to a float64 reference
 * on the emulated GPU share (ce_check.cc, scatter_check.cc; tests/cudaemu/check_lib.sh builds
 * them): bf16 conversions as the generated code makes them, and finding a kernel in the shared
 * object of a program's kernels (tests/cudaemu/build.sh). Not product code. */
#pragma once
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int (*FindFn)(const char *);
typedef int (*LaunchFn)(int, const unsigned *, const unsigned *, void **, char *, size_t);

/* bf16 <-> f32: the generated code's mbt_bf16_bits (round to nearest even, NaN kept quiet) */
static inline uint16_t bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t hi = b >> 16;
    if (x != x) return (uint16_t)(hi | 0x40u);
    return (uint16_t)((b + (hi & 1u) + 0x7fffu) >> 16);
}
static inline float bf16_float(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float x;
    memcpy(&x, &b, 4);
    return x;
}

/* Kernel `name` of the shared object `so_path`: its index, with *launch the object's launcher. When
 * either is missing, prints `FAIL WHAT/setup: why` and `0 passed, 1 failed` and returns -1. */
static inline int emu_kernel(const char *so_path, const char *name, const char *what, LaunchFn *launch) {
    void *so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        printf("FAIL %s/setup: %s\n0 passed, 1 failed\n", what, dlerror());
        return -1;
    }
    FindFn find = (FindFn)dlsym(so, "mbt_emu_find");
    *launch = (LaunchFn)dlsym(so, "mbt_emu_launch");
    int kid = find ? find(name) : -1;
    if (!*launch || kid < 0) {
        printf("FAIL %s/setup: kernel %s not found in %s\n0 passed, 1 failed\n", what, name, so_path);
        return -1;
    }
    return kid;
}
