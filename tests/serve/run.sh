#!/usr/bin/env bash
# tests/serve/run.sh BUILD - `PROG serve` (tests/run.sh's serve layer; docs/serve.md): builds
# tests/serve/gpt.mbt (and a copy whose serve block names the chatml template), trains it on
# mbt-gendata's corpus, then runs tests/serve/serve_test.py, which starts servers and prints
# `PASS serve/NAME`, `FAIL serve/NAME: why` or `SKIP serve/NAME: why` per check. The checks that
# need Hugging Face's `tokenizers` or the `openai` client print SKIP without them.
set -u
if [ $# -lt 1 ]; then
    echo "usage: tests/serve/run.sh BUILD" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "$1" && pwd) || exit 2
cd "$ROOT" || exit 2
# MBT_SERVE_MBTC: the compiler that builds the programs (the asan layer's BUILD/asan/mbtc, whose
# executables run under ASan + UBSan; its files then go to BUILD/tmp/asan-serve)
MBTC=${MBT_SERVE_MBTC:-$BUILD/mbtc}
DIR="$BUILD/tmp/serve"
[ -z "${MBT_SERVE_MBTC:-}" ] || DIR="$BUILD/tmp/asan-serve"
rm -rf "$DIR"
mkdir -p "$DIR" || exit 2
OUT="$DIR/setup.txt"
fail_setup() {
    echo "FAIL serve/setup: $1"
    tail -n 15 "$OUT" | sed 's/^/    /'
    exit 1
}
"$BUILD/mbt-gendata" --out-dir "$DIR/d" --name t --vocab 320 --tokens 100000 --val-tokens 0 >"$OUT" 2>&1 ||
    fail_setup "mbt-gendata failed"
sed 's/^  port     = 8000$/  port     = 8000\n  chat     = chatml/' tests/serve/gpt.mbt >"$DIR/gptchat.mbt"
grep -q 'chat     = chatml' "$DIR/gptchat.mbt" || fail_setup "the chat copy of gpt.mbt has no chat line"
# the two programs built at once (mbtc is one thread; CI has 2 cores), each its own output
"$MBTC" "$DIR/gptchat.mbt" -o "$DIR/gptchat" >"$DIR/build-chat.txt" 2>&1 &
chat_pid=$!
"$MBTC" tests/serve/gpt.mbt -o "$DIR/gpt" >"$OUT" 2>&1 || { wait $chat_pid; fail_setup "mbtc -o failed"; }
wait $chat_pid || { OUT="$DIR/build-chat.txt"; fail_setup "mbtc -o of the chat copy failed"; }
# the control of decode-batch-one-call: calls of forward_chunk of 16 rows (batch.tokens = 16)
sed 's/^  batch    { tokens = 64,/  batch    { tokens = 16,/; s/prefill_chunk = 8, seqs = 16/prefill_chunk = 8, seqs = 64/' \
    tests/serve/gpt.mbt >"$DIR/gpt16.mbt"
grep -q 'tokens = 16,' "$DIR/gpt16.mbt" || fail_setup "the 16-row copy of gpt.mbt has no tokens = 16"
"$MBTC" "$DIR/gpt16.mbt" -o "$DIR/gpt16" >"$DIR/build-16.txt" 2>&1 || { OUT="$DIR/build-16.txt"; fail_setup "mbtc -o of the 16-row copy failed"; }
"$DIR/gpt" train --data "$DIR/d/t_train.bin" --steps 200 --save-weights "$DIR/gpt.safetensors" >"$OUT" 2>&1 ||
    fail_setup "training failed"
[ -x "$BUILD/tests/sv_tokenize" ] || fail_setup "$BUILD/tests/sv_tokenize is not built (make unit)"
# the PyPI peers (openai, tokenizers) live in the virtual environment tools/deps.sh test makes
py=/usr/bin/python3
venv=${MBT_TEST_VENV:-build/pyenv}
[ -x "$venv/bin/python3" ] && py=$venv/bin/python3
"$py" tests/serve/serve_test.py "$BUILD" "$DIR"
