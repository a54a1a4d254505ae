# Shared by the training program's test scripts (source it after `set -u`): a scratch directory removed at
# exit, the tally of checks with ok/bad, the closing line, and the losses of a run.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "  ok   $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL $*"; }

# add_python_result FILE: adds the "RESULT <ok> <failed>" line a script's Python comparison wrote to FILE
# to the tally (no such line: the comparison itself failed, one failure)
add_python_result() {
    local good broken
    read -r _ good broken < <(grep '^RESULT' "$1" || echo "RESULT 0 1")
    passed=$((passed + good))
    failed=$((failed + broken))
}

# the closing line "N passed, M failed"; the script's exit status when it is the last command
finish() {
    echo "$passed passed, $failed failed"
    [[ $failed -eq 0 ]]
}

# logged_losses NAME: every training and validation loss of the run in $work/NAME, one per line, as logged
logged_losses() {
    grep -o '"event": "\(step\|val_loss\)", "step": [0-9]*\(, "total_steps": [0-9]*\)\?, "loss": [^,]*' \
        "$work/$1/log.jsonl" 2>/dev/null
}
