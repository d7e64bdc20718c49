#!/usr/bin/env bash
# tests/install/run.sh BUILD - install and carry (tests/run.sh's install layer; docs/install.md).
# `make install` into a temporary prefix, then the prefix is MOVED: from there mbtc --version must
# name the moved tree's runtime library and stdlib (not the build tree's), and the moved mbtc must
# build examples/mlp.mbt (which imports the stdlib's nn, optim and lr) from a directory outside
# the source tree, and the executable train a few steps on the moved mbt-gendata's corpus. Then
# `make dist`'s tarball, unpacked elsewhere, the same. Prints `PASS install/NAME` or
# `FAIL install/NAME: why` with details indented below; exit status 1 when anything failed.
set -u
if [ $# -lt 1 ]; then
    echo "usage: tests/install/run.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
# make's BUILD as the Makefile spells it (relative to the source tree where it is inside it)
MAKE_BUILD=$(realpath --relative-to="$ROOT" "$BUILD")
case "$MAKE_BUILD" in ../*) MAKE_BUILD=$BUILD ;; esac
DIR="$BUILD/tmp/install"
rm -rf "$DIR"
mkdir -p "$DIR/work" || exit 2
failed=0
pass() { echo "PASS install/$1"; }
fail() {
    echo "FAIL install/$1: $2"
    [ $# -ge 3 ] && [ -f "$3" ] && tail -n 15 "$3" | sed 's/^/    /'
    failed=1
}
OUT="$DIR/out.txt"

# carried NAME PREFIX: PREFIX (moved or unpacked) works on its own
carried() {
    local name=$1 p=$2 v
    if ! "$p/bin/mbtc" --version >"$OUT" 2>&1; then
        fail "$name-version" "mbtc --version failed" "$OUT"
        return
    fi
    v=$(cat "$OUT")
    local rt st
    rt=$(sed -n 's/^runtime: //p' "$OUT")
    st=$(sed -n 's/^stdlib: //p' "$OUT")
    if [[ "$v" != "mbtc "* ]] || [ -z "$rt" ] || [ -z "$st" ] \
        || [ "$(realpath "$rt" 2>/dev/null)" != "$(realpath "$p/lib/mbt/libmbtrt.a")" ] \
        || [ "$(realpath "$st" 2>/dev/null)" != "$(realpath "$p/share/mbt/stdlib")" ]; then
        fail "$name-version" "mbtc --version does not name the runtime library and stdlib under $p" "$OUT"
        return
    fi
    pass "$name-version"
    local w="$DIR/work/$name"
    mkdir -p "$w"
    (cd "$w" && "$p/bin/mbt-gendata" --out-dir data --name tiny --tokens 200000 --val-tokens 50000 \
        && MBT_CUDA_ARCH=none "$p/bin/mbtc" "$ROOT/examples/mlp.mbt" -o mlp \
        && ./mlp train --steps 5 --threads 1) >"$OUT" 2>&1
    if [ $? -ne 0 ] || [ ! -x "$w/mlp" ]; then
        fail "$name-build-and-train" "the moved mbtc could not build examples/mlp.mbt or it did not train" "$OUT"
    elif ! grep -q '^step 5/5: loss' "$OUT"; then
        fail "$name-build-and-train" "the executable did not report step 5" "$OUT"
    else
        pass "$name-build-and-train"
    fi
}

# make install, then move the prefix
P="$DIR/prefix"
if ! make --no-print-directory -s install BUILD="$MAKE_BUILD" PREFIX="$P" >"$OUT" 2>&1; then
    fail make-install "make install failed" "$OUT"
    exit 1
fi
missing=
for f in bin/mbtc bin/mbt-gendata lib/mbt/libmbtrt.a share/mbt/stdlib/nn.mbt; do
    [ -f "$P/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then fail make-install "the prefix lacks$missing"; else pass make-install; fi
mkdir -p "$DIR/elsewhere" && mv "$P" "$DIR/elsewhere/moved" || exit 2
carried moved "$DIR/elsewhere/moved"

# make dist, unpacked elsewhere
if ! make --no-print-directory -s dist BUILD="$MAKE_BUILD" >"$OUT" 2>&1; then
    fail make-dist "make dist failed" "$OUT"
else
    tgz=$(ls "$BUILD"/mbt-*-*.tar.gz 2>/dev/null | head -n 1)
    mkdir -p "$DIR/unpacked"
    if [ -z "$tgz" ] || ! tar -C "$DIR/unpacked" -xzf "$tgz" >"$OUT" 2>&1; then
        fail make-dist "no tarball in $BUILD, or it does not unpack" "$OUT"
    else
        pass make-dist
        carried dist "$(ls -d "$DIR"/unpacked/mbt-* | head -n 1)"
    fi
fi
exit $failed
