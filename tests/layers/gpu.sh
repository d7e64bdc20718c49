# shellcheck shell=bash
# tests/layers/gpu.sh - the gpu-emu layer: the attention templates, the segmented scatter_add, the online
# cross-entropy statistics, the paged KV cache's attention, bench/attention's and bench/gpu.py's dry runs and
# tests/gpu/run.sh on the emulated GPU (sourced by tests/run.sh; BUILD, TMP and report.sh's pass/fail/skip are set).

# The checks before tests/gpu/run.sh are single processes, mostly one core's work (g++ building the
# checks, mbtc, the emulated kernels): they run in two lanes at once, bench/gpu.py's dry run (the
# longest) beside the five others one after another; each writes its own folder (BUILD/tmp/cudaemu*,
# BUILD/bench/attention_prelude.cu, BUILD/tmp/bench-gpu and BUILD/bench/gpu). Their lines are
# relayed in this order once both lanes are done. tests/gpu/run.sh then runs two blocks at a time
# itself.
GPU_EMU_LANES='tests/gpu/check_bench_gpu.sh|tests/cudaemu/check_attention.sh tests/cudaemu/check_scatter.sh tests/cudaemu/check_ce.sh tests/cudaemu/check_kv.sh tests/cudaemu/check_bench_attention.sh'

# gpu_emu_lane SCRIPT...: each script run as `bash SCRIPT BUILD`, one after another, its output in
# $TMP/gpu-emu-NAME.out and its exit status in $TMP/gpu-emu-NAME.rc.
gpu_emu_lane() {
    local s n
    for s in "$@"; do
        n=$(basename "$s" .sh)
        bash "$s" "$BUILD" >"$TMP/gpu-emu-$n.out" 2>&1
        echo $? >"$TMP/gpu-emu-$n.rc"
    done
}

# the GPU tests (tests/gpu/run.sh) on the emulated GPU (the table's `nvrtc`: the executables'
# CUDA side is compiled by NVRTC)
layer_gpu_emu() {
    local s n rc
    run_lanes "$GPU_EMU_LANES" gpu_emu_lane
    for s in ${GPU_EMU_LANES//|/ }; do
        n=$(basename "$s" .sh)
        rc=$(cat "$TMP/gpu-emu-$n.rc" 2>/dev/null || echo "none (it did not finish)")
        relay gpu-emu "$TMP/gpu-emu-$n.out"
        if [ $((RELAY_P + RELAY_F)) = 0 ] || { [ "$rc" != 0 ] && [ "$RELAY_F" = 0 ]; }; then
            fail gpu-emu "$s exited with status $rc" "$TMP/gpu-emu-$n.out"
        fi
    done
    MBT_GPU_TEST_DEVICE=emu run_relayed gpu-emu tests/gpu/run.sh
}
