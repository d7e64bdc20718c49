#!/bin/sh
# tests/cudaemu/build.sh IN.cu OUT.so - compiles a program's CUDA C (`mbtc --emit=cuda`) for the
# host with cudaemu.h, into a shared object the CPU stand-in for the CUDA driver runs kernels
# from (tests/unit/fake_cuda.c, MBT_FAKE_CUDA_EMU=OUT.so). Every `__global__` function of IN is
# exported by name. CXX (default g++) compiles; the flags keep the host's arithmetic as the
# kernels' (no contraction into FMA, no fast math).
set -eu
if [ $# -ne 2 ]; then
    echo "usage: tests/cudaemu/build.sh IN.cu OUT.so" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
in=$1
out=$2
tu="$out.cc"
{
    printf '#line 1 "%s"\n' "$in"
    cat "$in"
    echo
    echo '/* ---- cudaemu: the kernels by name (tests/cudaemu/build.sh) ---- */'
    echo 'static const cudaemu::Entry cudaemu_kernels[] = {'
    # `extern "C" __global__ void [__launch_bounds__(...)] NAME(`, possibly over two lines
    tr '\n' ' ' <"$in" | sed 's/__launch_bounds__([^)]*)//g' |
        grep -oE '__global__ +void +[A-Za-z_][A-Za-z0-9_]* *\(' |
        sed -E 's/__global__ +void +([A-Za-z_][A-Za-z0-9_]*).*/    MBT_EMU_KERNEL(\1)/'
    echo '};'
    echo 'MBT_EMU_EXPORTS'
} >"$tu"
${CXX:-g++} -std=c++17 -O1 -fPIC -shared -ffp-contract=off -fno-fast-math -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 \
    -Wno-unused-function -Wno-unused-variable -Wno-unused-parameter \
    -I"$here/include" -include "$here/cudaemu.h" -o "$out" "$tu"
rm -f "$tu"
