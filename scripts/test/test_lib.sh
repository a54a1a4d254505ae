# Shared by the training program's test scripts (source it after `set -u`): a scratch directory removed at
# exit, the tally of checks with ok/bad, the closing line, the losses of a run, and impossible layouts refused.
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

# expect_refused NAME SUBSTRING RANKS FLAGS...: an impossible layout must be refused. Runs $binary on RANKS
# MPI ranks with the script's array refused_flags (the model and data every such run shares), then FLAGS, in
# a fresh output directory; passes on a non-zero exit with one "error:" line that contains SUBSTRING
# (every rank that reports prints the same line, so the distinct lines are counted)
expect_refused() {
    local name=$1 expected=$2 ranks=$3
    shift 3
    local out="$work/refused_$RANDOM"
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${refused_flags[@]}" --output-dir "$out" "$@" \
        >"$out.stdout" 2>"$out.stderr"
    local status=$? message
    message=$(grep '^error:' "$out.stderr" | sort -u)
    if [[ $status -eq 0 ]]; then bad "$name: exited 0"; return; fi
    if [[ $(echo "$message" | grep -c '^error:') -ne 1 || $message != *"$expected"* ]]; then
        bad "$name: expected one 'error:' line with '$expected', got: $(cat "$out.stderr")"
        return
    fi
    ok "$name: $message"
}

# losses_within NAME REFERENCE COUNT TOLERANCE: the COUNT training losses of run NAME within TOLERANCE
# relative of REFERENCE's (both in $work), pair by pair; one ok/bad line (BF16 layouts against one BF16
# rank: each script says next to its call why its tolerance holds)
losses_within() {
    local name=$1 reference=$2 count=$3 tolerance=$4 error
    error=$(PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" /usr/bin/python3 - "$work" "$name" "$reference" "$count" <<'EOF'
import sys
from layout_check import loss_error, losses
work, name, reference, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
one, mine = losses(work, reference), losses(work, name)
print(loss_error(one, mine) if len(one) == len(mine) == count else "inf")
EOF
)
    if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$error') <= $tolerance else 1)"; then
        ok "$name: $count losses within $error relative of $reference (tol $tolerance)"
    else
        bad "$name: losses differ from $reference by $error relative (tol $tolerance)"
    fi
}

# run_layout NAME RANKS B [FLAGS...]: the script's $binary (or $run_binary, when set) on RANKS MPI ranks with
# the script's array `flags`, B rows per data-parallel rank and micro-step, then FLAGS, into $work/NAME
# (output in $work/NAME.out); $run_steps steps (5 unless the script sets it) and --model custom unless FLAGS give
# them. A failed run is one bad line.
run_layout() {
    local name=$1 ranks=$2 batch=$3
    shift 3
    local extra=("$@")
    [[ " ${extra[*]} " == *" --steps "* ]] || extra+=(--steps "${run_steps:-5}")
    [[ " ${extra[*]} " == *" --model "* ]] || extra+=(--model custom)
    if ! mpirun --oversubscribe --allow-run-as-root -np "$ranks" "${run_binary:-$binary}" "${flags[@]}" --batch-size "$batch" \
        --output-dir "$work/$name" "${extra[@]}" >>"$work/$name.out" 2>&1; then
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
        return
    fi
    steady_steps "${extra[@]}" && host_calls_within_budget "$name"
}

# steady_steps FLAGS...: whether a run with these flags has steps the budget holds for: not a resumed run, and
# at least 3 steps (the first may allocate; under pp the last measures its timeline)
steady_steps() {
    local args=" $* " steps=${run_steps:-5}
    [[ $args == *" --resume "* ]] && return 1
    [[ $args =~ " --steps "([0-9]+)" " ]] && steps=${BASH_REMATCH[1]}
    [[ $steps -ge 3 ]]
}

# host_calls_within_budget NAME: every rank of run NAME kept the README's budget of allocations, frees,
# device-to-host copies and synchronisations per step (layout_check.py's host_call_budget_error); one ok/bad line
host_calls_within_budget() {
    local error summary
    { read -r error; read -r summary; } < <(PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" /usr/bin/python3 -c \
        "import sys; from layout_check import host_call_budget_error as e, host_call_summary as s
print(e(sys.argv[1], sys.argv[2])); print(s(sys.argv[1], sys.argv[2]))" "$work" "$1" 2>&1 | tr -d '\r')
    if [[ -z $error ]]; then ok "$1: host calls per step within the budget ($summary)"; else bad "$1: host calls: $error"; fi
}

# run_layouts LIST: run_layout for each "name:ranks:batch:flags" of LIST (whitespace between entries, commas for
# the spaces within flags)
run_layouts() {
    local layout name ranks batch layout_flags
    for layout in $1; do
        IFS=: read -r name ranks batch layout_flags <<<"$layout"
        run_layout "$name" "$ranks" "$batch" ${layout_flags//,/ }
    done
}

# folded_data DIR V: the classics' first tokens (data/classics_*.bin) folded into a vocabulary of V ids, for the
# layout suites whose subject is not the LM head: GPT-2's ids below V - 1 kept, the others taken modulo V - 1, the
# end of text at V - 1. Writes DIR/train.bin (100,000 tokens), DIR/val.bin (20,000) and DIR/tokenizer.bin (GPT-2's
# first V - 1 tokens and its end of text, to decode samples). At V = 512 a tiny model's embedding, LM head, loss
# and AdamW shrink about 100-fold: at GPT-2's 50,257 they took most of each run's time.
folded_data() {
    mkdir -p "$1"
    /usr/bin/python3 - "$1" "$2" <<'PYTHON'
import array, struct, sys
out, V = sys.argv[1], int(sys.argv[2])
end_of_text = 50256  # GPT-2's
for part, count in (("train", 100000), ("val", 20000)):
    with open(f"data/classics_{part}.bin", "rb") as f:
        header = list(struct.unpack("<256i", f.read(1024)))
        tokens = array.array("H")
        tokens.frombytes(f.read(2 * count))
    if header[:2] != [20240520, 1] or len(tokens) < count:
        sys.exit(f"data/classics_{part}.bin is not a shard of {count} tokens or more")
    folded = array.array("H", (V - 1 if t == end_of_text else t % (V - 1) for t in tokens))
    header[2] = count
    with open(f"{out}/{part}.bin", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(folded.tobytes())
with open("data/gpt2_tokenizer.bin", "rb") as f:
    header = list(struct.unpack("<256i", f.read(1024)))
    strings = []
    for _ in range(header[2]):
        length = f.read(1)[0]
        strings.append(f.read(length))
header[2], header[3] = V, V - 1
with open(f"{out}/tokenizer.bin", "wb") as f:
    f.write(struct.pack("<256i", *header))
    for s in strings[:V - 1] + [strings[end_of_text]]:
        f.write(bytes([len(s)]) + s)
PYTHON
}
