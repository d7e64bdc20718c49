/* cuda_fp16.h - empty: tests/cudaemu/cudaemu.h, forced in before the translation unit, defines what
 * mbt's kernels use of it. */
