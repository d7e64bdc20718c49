# shellcheck shell=bash
# tests/cudaemu/check_lib.sh - what the emulated GPU's kernel checks share (sourced by check_ce.sh
# and check_scatter.sh, each run as `SCRIPT BUILD`): the usage check, the work folder BUILD/tmp/cudaemu-NAME,
# the pass and fail counts with fail(), the host build of the check program NAME_check.cc, and a
# train block's kernels written by mbtc (--emit=cuda and --emit=kernels) and built by build.sh.
# Each script ends with check_done.

# check_begin NAME BUILD: sets dir, pass, failn; builds $dir/NAME_check; exits when it cannot
check_begin() {
    check_name=$1
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
    dir="$2/tmp/cudaemu-$check_name"
    mkdir -p "$dir"
    pass=0
    failn=0
    if ! ${CXX:-g++} -std=c++17 -O2 -o "$dir/${check_name}_check" "tests/cudaemu/${check_name}_check.cc" -ldl >"$dir/out" 2>&1; then
        fail setup "building ${check_name}_check.cc failed"
        check_done
    fi
}

fail() {
    echo "FAIL cudaemu/$check_name/$1: $2"
    [ -f "$dir/out" ] && sed 's/^/    /' "$dir/out" | head -n 40
    failn=$((failn + 1))
}

# check_block BUILD SRC BLOCK [TAG FLAG...]: $dir/TAG.cu, .kernels and .so (TAG is BLOCK unless
# given; the FLAGs go to mbtc); returns 1 (after fail) when it cannot
check_block() {
    local build=$1 src=$2 block=$3 tag=${4:-$3}
    shift 3
    [ $# -gt 0 ] && shift
    if ! "$build/mbtc" --emit=cuda "$src" --train "$block" "$@" >"$dir/$tag.cu" 2>"$dir/out" ||
        ! "$build/mbtc" --emit=kernels "$src" --train "$block" "$@" >"$dir/$tag.kernels" 2>"$dir/out"; then
        fail "$tag" "mbtc --emit=cuda / --emit=kernels failed"
        return 1
    fi
    if ! tests/cudaemu/build.sh "$dir/$tag.cu" "$dir/$tag.so" >"$dir/out" 2>&1; then
        fail "$tag" "tests/cudaemu/build.sh failed"
        return 1
    fi
}

# check_count FILE: adds the PASS and FAIL lines the check program printed to FILE
check_count() {
    grep -E '^(PASS|FAIL) ' "$1"
    pass=$((pass + $(grep -c '^PASS ' "$1")))
    failn=$((failn + $(grep -c '^FAIL ' "$1")))
}

check_done() {
    echo "$pass passed, $failn failed"
    [ "$failn" -eq 0 ]
    exit
}
