# shellcheck shell=bash
# tests/layers/accum.sh - the helper the accum layer's case (tests/accum/accum_4x4.mbt) names
# (sourced by tests/run.sh; see tests/layers/exec.sh for what a helper is).

# losses_agree LOG_A LOG_B N TOL: two --log files of N steps whose losses agree step by step to
# TOL relative.
losses_agree() {
    local losses
    losses=$(paste -d' ' <(log_losses "$1") <(log_losses "$2"))
    echo "$3 steps within $4"
    [ "$(echo "$losses" | wc -l)" = "$3" ] \
        && echo "$losses" | awk -v t="$4" '{ d = $1 - $2; if (d < 0) d = -d; if (!(d <= t * $2)) bad = 1 } END { exit bad }'
}
