#!/usr/bin/env bash
# tools/format.sh [--check] - formats the project's C sources with clang-format-19 and .clang-format
# (what `make format` runs); with --check, changes nothing and lists the files that are not in the
# house style (the format layer of make test), exit 1 when there are any.
# The sources: compiler/, runtime/ (not the CUDA of runtime/kernels/), the C of tests/ and tools/.
# Generated and foreign text stays out: the re2c lexer and lemon grammar (compiler/front/*.re, *.y).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-19}
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
    echo "tools/format.sh: $CLANG_FORMAT is not installed (tools/deps.sh test installs clang-format-19)" >&2
    exit 2
fi
mapfile -t files < <(find compiler runtime tests/unit tests/comm tests/tools tests/fuzz tests/runtime tests/cudaemu tools \
    -path runtime/kernels -prune -o -type f \( -name '*.c' -o -name '*.h' \) -print | LC_ALL=C sort)
if [ "${1:-}" = --check ]; then
    bad=()
    for f in "${files[@]}"; do
        "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if [ ${#bad[@]} -gt 0 ]; then
        printf 'not in the house style (make format rewrites them): %s\n' "${bad[*]}"
        exit 1
    fi
    echo "${#files[@]} files in the house style"
    exit 0
fi
"$CLANG_FORMAT" -i "${files[@]}"
