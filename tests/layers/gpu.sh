# shellcheck shell=bash
# tests/layers/gpu.sh - the gpu-emu layer: the attention templates, the segmented scatter_add, the online
# cross-entropy statistics, bench/attention's and bench/gpu.py's dry runs and
# tests/gpu/run.sh on the emulated GPU (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

# the GPU tests (tests/gpu/run.sh) on the emulated GPU (the table's `nvrtc`: the executables'
# CUDA side is compiled by NVRTC)
layer_gpu_emu() {
    run_relayed gpu-emu tests/cudaemu/check_attention.sh
    run_relayed gpu-emu tests/cudaemu/check_scatter.sh
    run_relayed gpu-emu tests/cudaemu/check_ce.sh
    run_relayed gpu-emu tests/cudaemu/check_bench_attention.sh
    run_relayed gpu-emu tests/gpu/check_bench_gpu.sh
    MBT_GPU_TEST_DEVICE=emu run_relayed gpu-emu tests/gpu/run.sh
}
