#!/usr/bin/env bash
# What real jobs meet, on the CPU build under mpirun (llmc/cpu/faults.h injects the faults):
#   a stalled rank    one rank of a 2-rank run stopped (SIGSTOP) with --collective-timeout 3: the job must
#                     end within the timeout plus 10 s of slack (mpirun's start and tear-down on a busy
#                     2-core machine), with one error line naming the waiting rank, the operation, the
#                     group, the step and the rank that did not arrive; once on a data-parallel all-reduce,
#                     once on a pipeline receive
#   a rank stalled    (LLMC_FAULT_STALL, --collective-timeout 3) before MPI_Init, inside a split, before its
#   unseen            first pipeline receive, and one whose abort never returns: each job ends within the
#                     timeout plus slack with the one line; without the arrival board (LLMC_FAULT_NO_BOARD)
#                     one line says so, a run trains on, and a stall still ends the job
#   mixed checkpoints a ZeRO-2 run on 2 ranks saves at steps 2 and 4: a stale shard (step 2's copied over
#                     step 4's) and a shard of another run are refused with one line naming the file; a
#                     missing shard makes the resume fall back to step 2 with a line, and continue exactly
#   a kill in a save  rank 0 killed between the shard files and the main file at --keep-checkpoints 1: a
#                     complete checkpoint remains, and the resume from it continues exactly
#   corruption        one bit flipped in one rank's parameters (dp replicas, tp copies): --check-replicas
#                     names the step, the tensor and the rank(s); without a fault it passes and changes
#                     nothing
#   kill and move     dp 2 x tp 2 at ZeRO-2 on 4 ranks, one rank killed (SIGKILL) mid-step: the job ends;
#                     the resume on 2 ranks as pp 2 matches an uninterrupted run on one rank within 1e-5
#                     (FP32: the layouts change only the order of additions)
#   usage: scripts/test/test_faults.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 512 token ids (test_lib.sh's folded_data): the faults are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--layers 2 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 0 --sample-tokens 0 --save-model 0
       --train-data "$work/data/train.bin")
mpi=(mpirun --oversubscribe --allow-run-as-root)
custom=(--model custom)  # run_layout adds it itself

# one_error NAME FILE SUBSTRING...: FILE holds exactly one distinct "error:" line, containing every SUBSTRING
one_error() {
    local name=$1 file=$2 message
    shift 2
    message=$(grep '^error:' "$file" | sort -u)
    if [[ $(echo "$message" | grep -c '^error:') -ne 1 ]]; then
        bad "$name: expected one error line, got: $(grep -v '^ ' "$file" | head -20)"
        return 1
    fi
    for expected in "$@"; do
        if [[ $message != *"$expected"* ]]; then bad "$name: '$expected' missing from: $message"; return 1; fi
    done
    ok "$name: $message"
}

# same_losses NAME REFERENCE FIRST LAST: steps FIRST..LAST of run NAME log exactly the losses REFERENCE's do
same_losses() {
    local name=$1 reference=$2 first=$3 last=$4 mine theirs
    mine=$(logged_losses "$name" | awk -F'"step": ' '{split($2, a, ","); if (a[1] >= '"$first"' && a[1] <= '"$last"') print}' | sort -u)
    theirs=$(logged_losses "$reference" | awk -F'"step": ' '{split($2, a, ","); if (a[1] >= '"$first"' && a[1] <= '"$last"') print}' | sort -u)
    if [[ -n $mine && $mine == "$theirs" && $(echo "$mine" | wc -l) -eq $((last - first + 1)) ]]; then
        ok "$name: steps $first-$last log the same losses as $reference, bit for bit"
    else
        bad "$name: steps $first-$last differ from $reference: $(echo $mine) vs $(echo $theirs)"
    fi
}

# ---------------------------------------------------------------------------------------------------------
# a stalled rank: stall NAME WORLD_RANK EXTRA_FLAGS... stops WORLD_RANK once step 3 is logged
timeout=3
stall() {
    local name=$1 victim=$2
    shift 2
    local out="$work/$name"
    "${mpi[@]}" -np 2 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 --steps 100000 --output-dir "$out" \
        --collective-timeout $timeout "$@" >"$out.stdout" 2>"$out.stderr" &
    local job=$! pid="" i
    for i in $(seq 300); do grep -q '"step": 3,' "$out/log.jsonl" 2>/dev/null && break; sleep 0.1; done
    for p in $(pgrep -f -- "--output-dir $out"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && pid=$p
    done
    if [[ -z $pid ]]; then bad "$name: rank $victim never started"; kill "$job"; wait "$job"; return; fi
    kill -STOP "$pid"
    local start=$SECONDS
    wait "$job"
    local status=$? took=$((SECONDS - start))
    kill -KILL "$pid" 2>/dev/null
    if [[ $status -eq 0 ]]; then bad "$name: the job exited 0"; return; fi
    if ((took > timeout + 10)); then bad "$name: the job ended $took s after the stop (timeout $timeout)"; return; fi
    ok "$name: the job ended $took s after rank $victim stopped (status $status)"
    # which operation the other rank waits in depends on where the stop caught rank $victim; that it was
    # rank $victim does not: it did not arrive, or (stopped inside the operation) its heartbeat stood still
    local pattern="^error: rank $((1 - victim)) waited [0-9]+ s in [a-z-]+( (from|to) rank $victim)? on the .+ group at "
    pattern+="step [0-9]+: (rank $victim did not arrive|.*rank $victim stopped running).* \(--collective-timeout 3\)$"
    one_error "$name" "$out.stderr" "" && grep '^error:' "$out.stderr" | sort -u | grep -Eq "$pattern" &&
        ok "$name: the line names the waiting rank, the operation, the group, the step and rank $victim" ||
        bad "$name: the line does not match $pattern"
}
echo "a stalled rank ends the job"
stall stalled_dp 1 --zero 1
stall stalled_pp 0 --pp 2

# stall_at NAME FAULT SLACK PATTERN FLAGS...: a 2-rank run with LLMC_FAULT_STALL=FAULT (a rank that stops making
# progress at a point where it is in no collective, llmc/cpu/faults.h) and --collective-timeout 3 must end
# within 3 s plus SLACK, not exit 0, report the injected fault, and print one error line matching PATTERN.
# (`timeout 60` turns a job that never ends into a failure instead of a hung suite.)
stall_timeout=3
stall_at() {
    local name=$1 fault=$2 slack=$3 pattern=$4
    shift 4
    local out="$work/$name" start=$SECONDS
    LLMC_FAULT_STALL=$fault timeout -k 5 60 "${mpi[@]}" -x LLMC_FAULT_STALL -np 2 "$binary" \
        "${custom[@]}" "${flags[@]}" --batch-size 4 --steps 3 --output-dir "$out" --collective-timeout $stall_timeout \
        "$@" >"$out.stdout" 2>"$out.stderr"
    local status=$? took=$((SECONDS - start)) point
    if [[ $status -eq 0 || $status -ge 124 ]]; then bad "$name: the job exited $status after $took s"; return; fi
    if ((took > stall_timeout + slack)); then bad "$name: the job ended after $took s (timeout $stall_timeout)"; return; fi
    for point in ${fault//,/ }; do
        grep -q "^fault injected: rank ${point#*:} stalls at ${point%:*}$" "$out.stderr" ||
            { bad "$name: the fault $point was not injected: $(head -5 "$out.stderr")"; return; }
    done
    ok "$name: the job ended $took s after its start (status $status; --collective-timeout $stall_timeout)"
    one_error "$name" "$out.stderr" "" && grep '^error:' "$out.stderr" | sort -u | grep -Eq "$pattern" &&
        ok "$name: the line matches $pattern" || bad "$name: the line does not match $pattern"
}
tail="\(--collective-timeout $stall_timeout\)$"
echo "a rank stalled where no collective shows it ends the job"
# rank 1 never calls MPI_Init: rank 0 waits inside it, before the world (and its arrival board) exists
stall_at stalled_before_init before-init:1 10 \
    "^error: rank 0 waited [0-9]+ s in MPI_Init_thread at start-up: which rank did not arrive is not known .*$tail"
# rank 1 stops inside the mesh's first split, before calling it: rank 0 waits in the split of the world
stall_at stalled_in_split in-split:1 10 "^error: rank 0 waited [0-9]+ s in split on the world group at set-up: rank 1 did not arrive $tail"
# rank 1 stops before its first pipeline group: rank 0 waits for it on their link, before the link was ever used
stall_at stalled_before_first_p2p before-first-p2p:1 10 \
    "^error: rank 0 waited [0-9]+ s in [a-z -]+( (from|to) rank 1)? on the pp link 0-1 group at step 1: rank 1 did not arrive $tail" --pp 2
# the same, and rank 0's abort never returns: the job still ends, kAbortGraceSeconds (3 s) after the line
stall_at abort_never_returns before-first-p2p:1,abort:0 13 \
    "^error: rank 0 waited [0-9]+ s in [a-z -]+( (from|to) rank 1)? on the pp link 0-1 group at step 1: rank 1 did not arrive $tail" --pp 2
# without the arrival board (rank 1's allocation fails): said once, and a stall still ends the job, the line
# naming the group's members as the candidates (mpirun's ranks on this machine inherit the variable)
export LLMC_FAULT_NO_BOARD=1
stall_at stalled_without_board in-split:1 10 \
    "^error: rank 0 waited [0-9]+ s in split on the world group at set-up: which of ranks 0,1 did not arrive is not known $tail"
warnings=$(grep -c "^warning: rank 1 cannot create the watchdog's arrival board" "$work/stalled_without_board.stderr")
[[ $warnings -eq 1 ]] && ok "no board: one line says so" || bad "no board: $warnings lines say so"
run_layout no_board 2 4 --zero 1 --steps 2 --collective-timeout $stall_timeout
warnings=$(grep -c "arrival board" "$work/no_board.out" 2>/dev/null)
[[ $warnings -eq 1 && -s $work/no_board/log.jsonl ]] && ok "no board: a 2-rank run trains on, one line says so" ||
    bad "no board: $warnings lines, log: $(ls "$work/no_board" 2>&1)"
unset LLMC_FAULT_NO_BOARD
LLMC_FAULT_STALL=nowhere:1 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 --steps 1 --output-dir "$work/malformed" \
    >"$work/malformed.out" 2>&1
[[ $? -ne 0 ]] && one_error "a malformed LLMC_FAULT_STALL" "$work/malformed.out" "unknown point 'nowhere'" ||
    bad "a malformed LLMC_FAULT_STALL: exited 0"

# ---------------------------------------------------------------------------------------------------------
echo "checkpoints that cannot mix"
run_layout saved 2 4 --zero 2 --steps 4 --checkpoint-every 2 --keep-checkpoints 2
run_layout other_run 2 4 --zero 2 --steps 4 --checkpoint-every 2 --keep-checkpoints 2 --init-seed 7
run_layout one 1 8 --steps 8
run_layout straight 2 4 --zero 2 --steps 8  # what the resumed runs must repeat bit for bit
# resume_from NAME SETUP: copies the saved run's checkpoints to $work/NAME, runs SETUP there (a command
# string), then resumes to step 8 on 2 ranks (output in $work/NAME.out)
resume_from() {
    local name=$1 setup=$2
    mkdir -p "$work/$name" && cp "$work"/saved/checkpoint_* "$work/$name/"
    (cd "$work/$name" && eval "$setup")
    "${mpi[@]}" -np 2 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 --zero 2 --steps 8 --output-dir "$work/$name" --resume \
        >"$work/$name.out" 2>&1
}
resume_from stale "cp checkpoint_2.shard1.bin checkpoint_4.shard1.bin"
[[ $? -ne 0 ]] && one_error "stale shard refused" "$work/stale.out" "checkpoint_4.shard1.bin belongs to another checkpoint" \
    "step 2" || bad "stale shard: the resume exited 0"
resume_from foreign "cp ../other_run/checkpoint_4.shard1.bin ."
[[ $? -ne 0 ]] && one_error "another run's shard refused" "$work/foreign.out" \
    "checkpoint_4.shard1.bin belongs to another checkpoint" || bad "another run's shard: the resume exited 0"
resume_from missing "rm checkpoint_4.shard1.bin"
if [[ $? -eq 0 ]] && grep -q "checkpoint of step 4 is incomplete (its shard file .*checkpoint_4.shard1.bin is missing): skipped" \
    "$work/missing.out" && grep -q "resumed from .*checkpoint_2.bin at step 2" "$work/missing.out"; then
    ok "missing shard: one line, and the resume falls back to step 2"
    same_losses missing straight 3 8
else
    bad "missing shard: $(grep -v '^ ' "$work/missing.out" | head -20)"
fi

# rank 0 killed after every shard file of step 4 is written, before the main file; one checkpoint kept
LLMC_FAULT_KILL=before-main-file:0:4 "${mpi[@]}" -x LLMC_FAULT_KILL -np 2 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 \
    --zero 2 --steps 8 --checkpoint-every 2 --keep-checkpoints 1 --output-dir "$work/killed_save" >"$work/killed_save.out" 2>&1
status=$?
files=$(cd "$work/killed_save" && ls checkpoint_* | tr '\n' ' ')
if [[ $status -ne 0 && $files == "checkpoint_2.bin checkpoint_2.shard1.bin checkpoint_4.shard1.bin " ]]; then
    ok "killed during the save of step 4 (status $status): the complete checkpoint of step 2 remains ($files)"
else
    bad "killed during a save: status $status, files: $files"
fi
"${mpi[@]}" -np 2 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 --zero 2 --steps 8 --checkpoint-every 2 --keep-checkpoints 1 \
    --output-dir "$work/killed_save" --resume >"$work/killed_save_resumed.out" 2>&1
if [[ $? -eq 0 ]] && grep -q "checkpoint of step 4 is incomplete (it has shard files but no main file" \
    "$work/killed_save_resumed.out" && grep -q "resumed from .*checkpoint_2.bin at step 2" "$work/killed_save_resumed.out"; then
    ok "the resume after the killed save falls back to step 2"
    same_losses killed_save straight 3 8
    files=$(cd "$work/killed_save" && ls checkpoint_* | tr '\n' ' ')
    [[ $files == "checkpoint_8.bin checkpoint_8.shard1.bin " ]] && ok "keep 1: only step 8's files remain ($files)" ||
        bad "keep 1: files left: $files"
else
    bad "resume after the killed save: $(grep -v '^ ' "$work/killed_save_resumed.out" | head -20)"
fi

# ---------------------------------------------------------------------------------------------------------
echo "silent data corruption caught"
# flip RANKS NAME FAULT FLAGS...: the run must stop at step 3 with one line
flip() {
    local ranks=$1 name=$2 fault=$3
    shift 3
    LLMC_FAULT_FLIP_BIT=$fault "${mpi[@]}" -x LLMC_FAULT_FLIP_BIT -np "$ranks" "$binary" "${custom[@]}" "${flags[@]}" --steps 6 \
        --check-replicas 1 --output-dir "$work/$name" "$@" >"$work/$name.out" 2>&1
}
flip 3 flip_dp 1:3:fcw:1:17:12 --batch-size 2
[[ $? -ne 0 ]] && one_error "bit flip in a dp replica" "$work/flip_dp.out" "at step 3: rank 1 holds a copy of fcw of layer 1" \
    "differs from rank 0, rank 2's (data-parallel replicas)" || bad "bit flip in a dp replica: exited 0"
flip 2 flip_tp 1:3:ln2b:0:5:30 --batch-size 8 --tp 2
[[ $? -ne 0 ]] && one_error "bit flip in a tp copy" "$work/flip_tp.out" "at step 3: the copies of ln2b of layer 0 differ" \
    "rank 0, rank 1 (tp copies of a replicated tensor" || bad "bit flip in a tp copy: exited 0"
# a flip in a tensor that tp slices is not a tp copy; with two dp replicas the check still sees it
flip 4 flip_dp_tp 3:3:qkvw:0:100:2 --batch-size 4 --tp 2 --zero 1
[[ $? -ne 0 ]] && one_error "bit flip in a sliced tensor of a dp x tp layout" "$work/flip_dp_tp.out" \
    "the copies of qkvw of layer 0 differ between rank 1, rank 3 (data-parallel replicas" ||
    bad "bit flip in dp x tp: exited 0"
# no fault: the check passes at every step and the losses are the unchecked run's
for layout in "clean_dp2_tp2_zero2:4:4:--tp,2,--zero,2" "clean_hsdp2x2_zero3:4:2:--zero,3,--dp-shard,2"; do
    IFS=: read -r name ranks batch layout_flags <<<"$layout"
    run_layout "$name" "$ranks" "$batch" ${layout_flags//,/ } --check-replicas 1 --steps 8
    run_layout "${name}_unchecked" "$ranks" "$batch" ${layout_flags//,/ } --steps 8
    same_losses "$name" "${name}_unchecked" 1 8
done

# ---------------------------------------------------------------------------------------------------------
echo "kill one rank, restart elsewhere, continue"
LLMC_FAULT_KILL=mid-step:2:6 "${mpi[@]}" -x LLMC_FAULT_KILL -np 4 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 4 --tp 2 \
    --zero 2 --steps 8 --checkpoint-every 2 --keep-checkpoints 2 --output-dir "$work/moved" >"$work/moved_killed.out" 2>&1
status=$?
[[ $status -ne 0 ]] && grep -q "fault injected: rank 2 killed at mid-step of step 6" "$work/moved_killed.out" &&
    ok "dp 2 x tp 2, ZeRO-2: rank 2 killed mid-step 6, the job ended (status $status)" ||
    bad "the killed 4-rank job: status $status"
"${mpi[@]}" -np 2 "$binary" "${custom[@]}" "${flags[@]}" --batch-size 8 --pp 2 --steps 8 --output-dir "$work/moved" --resume \
    >"$work/moved.out" 2>&1
if [[ $? -eq 0 ]] && grep -q "resumed from .*checkpoint_4.bin at step 4" "$work/moved.out"; then
    ok "resumed on 2 ranks as pp 2 from the complete checkpoint of step 4"
    # (its log holds steps 1-5 of the killed run too: compare the resumed steps only)
    losses_within_steps() {
        local error
        error=$(/usr/bin/python3 - "$work" <<'EOF'
import json, sys
def losses(name, first, last):
    found = {}
    for line in open(f"{sys.argv[1]}/{name}/log.jsonl"):
        event = json.loads(line)
        if event.get("event") == "step" and first <= event["step"] <= last:
            found[event["step"]] = event["loss"]  # the resumed run's value comes last
    return [found[s] for s in sorted(found)]
one, moved = losses("one", 5, 8), losses("moved", 5, 8)
print(max(abs(b - a) / abs(a) for a, b in zip(one, moved)) if len(one) == len(moved) == 4 else "inf")
EOF
)
        if /usr/bin/python3 -c "import sys; sys.exit(0 if float('$error') <= 1e-5 else 1)"; then
            ok "moved: steps 5-8 within $error relative of one rank (tol 1e-5, FP32)"
        else
            bad "moved: steps 5-8 differ from one rank by $error relative"
        fi
    }
    losses_within_steps
else
    bad "the resume on pp 2: $(grep -v '^ ' "$work/moved.out" | head -20)"
fi

finish
