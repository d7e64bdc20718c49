#!/usr/bin/env bash
# tests/cudaemu/check_bench_attention.sh BUILD - bench/attention's dry run: its harness
# (bench/attention_harness.cu, which drives mbt's attention kernels on a GPU) built with
# cudaemu.h and run on the emulated GPU on small shapes against a float64 reference (the
# gpu-emu layer relays its PASS/FAIL lines). Times are never taken here.
set -u
if [ $# -ne 1 ]; then
    echo "usage: tests/cudaemu/check_bench_attention.sh BUILD" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
/usr/bin/python3 bench/attention --dry --build "$1"
