#!/bin/sh
# tests/cudaemu/build.sh IN.cu OUT.so - compiles a program's CUDA C (`mbtc --emit=cuda`) for the
# host with cudaemu.h, into a shared object the CPU stand-in for the CUDA driver runs kernels
# from (tests/cudaemu/fake_cuda.c, MBT_FAKE_CUDA_EMU=OUT.so). Every `__global__` function of IN is
# exported by name.
# tests/cudaemu/build.sh --exe IN.cc OUT - the same compilation of a translation unit with a main
# of its own (tests/cudaemu/attention_check.cc), into an executable.
# CXX (default g++) compiles; the flags keep the host's arithmetic as the kernels' (no contraction
# into FMA, no fast math).
set -eu
exe=0
if [ "${1:-}" = --exe ]; then
    exe=1
    shift
fi
if [ $# -ne 2 ]; then
    echo "usage: tests/cudaemu/build.sh [--exe] IN OUT" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
in=$1
out=$2
# this process's own translation unit and output, the output renamed into place at the end: the
# ranks of a multi-process test may build the same OUT at once (tests/gpu/run.sh's ranks), and one
# must never compile, or load, a file another is still writing
tu="$out.$$.cc"
tmp="$out.$$.tmp"
if [ $exe = 1 ]; then
    cp "$in" "$tu"
else
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
fi
${CXX:-g++} -std=c++17 -O2 -fPIC $([ $exe = 1 ] || echo -shared) -ffp-contract=off -fno-fast-math -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 \
    -Wno-unused-function -Wno-unused-variable -Wno-unused-parameter \
    -I"$here/include" -include "$here/cudaemu.h" -o "$tmp" "$tu" || {
    rm -f "$tu" "$tmp"
    exit 1
}
rm -f "$tu"
mv -f "$tmp" "$out"
