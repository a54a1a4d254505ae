#!/usr/bin/env bash
# Asynchronous checkpoints (--checkpoint-async, llmc/parallel/reshard.h), on 2 ranks at ZeRO-2 so that a shard
# file exists beside the main file, a tiny model on the classics folded into 512 ids:
#   the same bits    runs of 8 steps saving every 2 steps, synchronously and asynchronously, leave the same
#                    model.bin, byte for byte; the last checkpoint's files hold the same sections, byte for byte,
#                    but for the id drawn at the save (and the main file's list of shard files, which carries it)
#   resume           an asynchronous run of 4 steps resumed to 8 logs the losses of the synchronous run, bit for bit,
#                    and leaves its model.bin, under late streams (a snapshot that did not wait for its copies
#                    would save stale bytes)
#   a kill mid-write the writer thread killed (LLMC_FAULT_KILL=in-async-save) with the file of step 4 written and
#                    not committed, on rank 1 (its shard file) and on rank 0 (the main file): the checkpoint of
#                    step 2 stays the newest complete one, and the resume from it continues bit for bit
#   bad flags        a value that is not a boolean, and --checkpoint-async without --checkpoint-every, are refused
#                    with one line
#   usage: scripts/test/test_async_checkpoint.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

folded_data "$work/data" 512
flags=(--model custom --layers 2 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 0 --sample-tokens 0
       --train-data "$work/data/train.bin" --batch-size 4 --zero 2)
mpi=(mpirun --oversubscribe --allow-run-as-root)

# train NAME STEPS [FLAGS...]: 2 ranks into $work/NAME (output in $work/NAME.out); the exit status is the run's
train() {
    local name=$1 steps=$2
    shift 2
    "${mpi[@]}" -np 2 "$binary" "${flags[@]}" --steps "$steps" --output-dir "$work/$name" "$@" >>"$work/$name.out" 2>&1
}
# same_model NAME REFERENCE: the two runs' model.bin are the same bytes
same_model() {
    if cmp -s "$work/$1/model.bin" "$work/$2/model.bin"; then ok "$1: model.bin equals $2's, byte for byte"
    else bad "$1: model.bin differs from $2's"; fi
}
# same_losses NAME REFERENCE FIRST LAST: steps FIRST..LAST of run NAME log exactly REFERENCE's training losses
same_losses() {
    local mine theirs
    mine=$(logged_losses "$1" | awk -F'"step": ' '{split($2, a, ","); if (a[1] >= '"$3"' && a[1] <= '"$4"') print}' | sort -u)
    theirs=$(logged_losses "$2" | awk -F'"step": ' '{split($2, a, ","); if (a[1] >= '"$3"' && a[1] <= '"$4"') print}' | sort -u)
    if [[ -n $mine && $mine == "$theirs" && $(echo "$mine" | wc -l) -eq $(($4 - $3 + 1)) ]]; then
        ok "$1: steps $3-$4 log the same losses as $2, bit for bit"
    else
        bad "$1: steps $3-$4 differ from $2: $(echo $mine) vs $(echo $theirs)"
    fi
}
# committed DIR: the checkpoint files in DIR (no .tmp), on one line
committed() { (cd "$1" && ls checkpoint_*.bin 2>/dev/null | tr '\n' ' '); }

echo "the same bits as a synchronous save"
train sync 8 --checkpoint-every 2 || bad "sync: the run failed"  # what every run below must repeat
train async 8 --checkpoint-every 2 --checkpoint-async || bad "async: the run failed"
same_model async sync
# each file's sections: names in order, and bytes, equal but for the id (llmc/io/checkpoint.h's layout)
for file in checkpoint_8.bin checkpoint_8.shard1.bin; do
    verdict=$(/usr/bin/python3 - "$work/sync/$file" "$work/async/$file" <<'EOF'
import struct, sys
def sections(path):
    data = open(path, "rb").read()
    magic, version, count, table = struct.unpack_from("<8sIIQ", data, 0)
    if magic != b"LLMCCKPT":
        sys.exit(f"{path}: not a checkpoint")
    found = []
    for i in range(count):
        name, offset, size, _ = struct.unpack_from("<48sQQQ", data, table + 72 * i)
        found.append((name.rstrip(b"\0").decode(), data[offset:offset + size]))
    return found
sync, asynchronous = sections(sys.argv[1]), sections(sys.argv[2])
if [n for n, _ in sync] != [n for n, _ in asynchronous]:
    sys.exit(f"sections differ: {[n for n, _ in sync]} vs {[n for n, _ in asynchronous]}")
varying = {"checkpoint_id", "shard_files"}
differ = [n for (n, a), (_, b) in zip(sync, asynchronous) if a != b and n not in varying]
ids = [a != b for (n, a), (_, b) in zip(sync, asynchronous) if n == "checkpoint_id"]
print(f"differ in {differ}" if differ else f"{len(sync)} sections equal but the id" + ("" if ids == [True] else " (the ids are equal?)"))
EOF
)
    [[ $verdict == *"sections equal but the id" ]] && ok "$file: $verdict" || bad "$file: $verdict"
done
for name in sync async; do
    n=$(grep -c '"event": "checkpoint".*"save_ms": [0-9.e+-]*, "async": '"$([[ $name == async ]] && echo true || echo false)" \
        "$work/$name/log.jsonl")
    [[ $n -eq 4 ]] && ok "$name: 4 checkpoint events with save_ms and the mode" || bad "$name: $n checkpoint events with save_ms"
done

echo "resumed from an asynchronous checkpoint"
# under late streams (llmc/cpu/runtime.h), so that a snapshot read before its copies ran would hold stale bytes
plain_mpi=("${mpi[@]}")
mpi+=(-x LLMC_CPU_LATE_STREAMS=1)
train resumed 4 --checkpoint-every 2 --checkpoint-async || bad "resumed: the first run failed"
if train resumed 8 --checkpoint-every 2 --checkpoint-async --resume &&
    grep -q "resumed from .*checkpoint_4.bin at step 4" "$work/resumed.out"; then
    same_losses resumed sync 5 8
    same_model resumed sync
else
    bad "resumed: $(grep -v '^ ' "$work/resumed.out" | tail -5)"
fi
mpi=("${plain_mpi[@]}")

echo "a kill while the writer thread writes"
# kill_in_write NAME RANK EXPECTED_FILES UNFINISHED: rank RANK's writer thread killed with its file of step 4 written
# and not committed (one checkpoint kept): EXPECTED_FILES committed, UNFINISHED (a .tmp) left; then the resume to
# step 8
kill_in_write() {
    local name=$1 rank=$2 expected=$3 unfinished=$4 files status
    local mpi=("${mpi[@]}" -x "LLMC_FAULT_KILL=in-async-save:$rank:4")  # (train's mpirun, in this function only)
    train "$name" 8 --checkpoint-every 2 --checkpoint-async --keep-checkpoints 1
    status=$?
    mpi=("${plain_mpi[@]}")  # the resume runs clean
    files=$(committed "$work/$name")
    if [[ $status -ne 0 ]] && grep -q "fault injected: rank $rank killed at in-async-save of step 4" "$work/$name.out" &&
        [[ $files == "$expected" && -f $work/$name/$unfinished ]]; then
        ok "$name: killed in the write of step 4 (status $status); committed: $files; left unfinished: $unfinished"
    else
        bad "$name: status $status, committed: $files; $(grep -v '^ ' "$work/$name.out" | tail -3)"
    fi
    if train "$name" 8 --checkpoint-every 2 --checkpoint-async --keep-checkpoints 1 --resume &&
        grep -q "resumed from .*checkpoint_2.bin at step 2" "$work/$name.out"; then
        ok "$name: the resume takes step 2, the newest complete checkpoint"
        same_losses "$name" sync 3 8
        same_model "$name" sync
    else
        bad "$name: the resume: $(grep -v '^ ' "$work/$name.out" | tail -5)"
    fi
}
kill_in_write killed_shard_writer 1 "checkpoint_2.bin checkpoint_2.shard1.bin " checkpoint_4.shard1.bin.tmp
kill_in_write killed_main_writer 0 "checkpoint_2.bin checkpoint_2.shard1.bin checkpoint_4.shard1.bin " checkpoint_4.bin.tmp

echo "bad flags refused"
refused_flags=("${flags[@]}" --steps 2)
expect_refused "--checkpoint-async=maybe" "checkpoint-async" 1 --checkpoint-async=maybe --checkpoint-every 1
expect_refused "--checkpoint-async without --checkpoint-every" "without --checkpoint-every" 1 --checkpoint-async

finish
