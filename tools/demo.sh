#!/usr/bin/env bash
# tools/demo.sh BUILD - what `make demo` shows: what mbtc is, every example checked, the AST of
# examples/tiny.mbt as the compiler sees it, and the message for a program with a shape mistake.
# Exit status 0 when every example checks clean.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -lt 1 ]; then
    echo "usage: tools/demo.sh BUILD" >&2
    exit 2
fi
if ! BUILD=$(cd "$1" 2>/dev/null && pwd); then
    echo "tools/demo.sh: no build directory '$1' (run make first)" >&2
    exit 1
fi
MBTC="$BUILD/mbtc"
if [ ! -x "$MBTC" ]; then
    echo "tools/demo.sh: $MBTC does not exist (run make first)" >&2
    exit 1
fi
cd "$ROOT" || exit 1
mkdir -p "$BUILD/tmp" || exit 1
# mbtc finds the stdlib beside itself (<bindir>/../stdlib); a build directory elsewhere is
# pointed at the repository's.
if [ ! -d "$BUILD/../stdlib" ]; then export MBT_PATH="$ROOT/stdlib${MBT_PATH:+:$MBT_PATH}"; fi

rule() { printf '\n== %s %s\n' "$1" "$(printf '%*s' $((70 - ${#1})) '' | tr ' ' '=')"; }

rule "mbtc"
echo "$("$MBTC" --version): the compiler for .mbt model programs (docs/language.md)."
echo "It reads a model, its training or serving setup and the stdlib (stdlib/), and checks"
echo "names, types, shapes and settings before anything runs. Usage: mbtc --check FILE.mbt"

rule "checking the examples"
all_ok=1
for f in examples/*.mbt; do
    [ -f "$f" ] || continue
    err="$BUILD/tmp/demo-check.err"
    t0=$(date +%s%N)
    "$MBTC" --check "$f" 2>"$err" >/dev/null
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    if [ "$rc" = 0 ] && [ ! -s "$err" ]; then
        printf 'OK      %-24s (%d ms)\n' "$f" "$ms"
    else
        all_ok=0
        printf 'FAILED  %-24s (exit status %d)\n' "$f" "$rc"
        sed 's/^/        /' "$err" | head -n 30
    fi
done

rule "what the compiler sees: mbtc --emit=ast examples/tiny.mbt (first 40 lines)"
if [ -f examples/tiny.mbt ]; then
    "$MBTC" --emit=ast examples/tiny.mbt 2>&1 | head -n 40
else
    echo "(examples/tiny.mbt is missing)"
fi

rule "a mistake, caught before anything runs"
demo="$BUILD/tmp/demo_mistake.mbt"
cat >"$demo" <<'EOF'
# The projection is 4 * d wide, but forward promises a result d wide.
model Proj(d = 64) {
  w = param f32[d, 4 * d] ~ normal(0, 0.02)

  fn forward(x: f32[B, T, d]) -> f32[B, T, d] {
    return x @ w
  }
}
EOF
echo "\$ cat $demo"
cat "$demo"
echo "\$ mbtc --check $demo"
"$MBTC" --check "$demo" 2>&1
echo "(exit status $?)"

echo
if [ "$all_ok" = 1 ]; then
    echo "every example checks."
    exit 0
fi
echo "some examples did not check (see above)."
exit 1
