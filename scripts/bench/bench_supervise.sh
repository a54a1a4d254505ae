#!/usr/bin/env bash
# A longer run of the five faults of scripts/test/test_supervise.sh, unattended: 4 layers x 128 channels, 60 steps on
# 4 ranks under scripts/supervise, a checkpoint every 5 steps (asynchronous), the replicas checked every 10.
#   launch 1  rank 3 computes 3x as long (named a straggler, logged, no restart); rank 2 killed mid-step 17
#   launch 2  rank 1 stalls in its first split (the watchdog, --collective-timeout 5)
#   launch 3  rank 1 flips a bit of ln2w after step 30; the check of step 30 catches it, the check of step 20 was
#             the last to pass: step 25's checkpoint is set aside, the job resumes from step 20's
#   launch 4  rank 0 killed while writing the checkpoint of step 40: step 35's is the newest complete one
#   launch 5  the last rank finishes
# Prints the supervisor's log (restarts, straggler, goodput), the job's wall time, and how far its 60 losses are
# from an uninterrupted run on one rank (FP32: within 1e-5 relative, as in test_supervise.sh).
#   usage: scripts/bench/bench_supervise.sh [BINARY]     (default ./train_gpt_fp32_cpu)
set -uo pipefail
cd "$(dirname "$0")/../.."
binary=${1:-./train_gpt_fp32_cpu}
make --no-print-directory -s "${binary#./}" >/dev/null || exit 1
binary=$(realpath "$binary")
source scripts/test/test_lib.sh  # (folded_data, and $work: a temporary directory removed at the end)
export OMP_NUM_THREADS=1
folded_data "$work/data" 512
flags=(--model custom --layers 4 --heads 4 --channels 128 --vocab-size 512 --max-seq-len 64 --seq-len 64
       --total-batch-size 768 --lr-schedule constant --learning-rate 1e-3 --val-every 0 --sample-tokens 0
       --save-model 0 --train-data "$work/data/train.bin" --steps 60)
echo "4 layers x 128 channels, 768 tokens per step, 60 steps; $(nproc --all) cores"
start=$(date +%s.%N)
LLMC_FAULT_SLOW=3:3 LLMC_FAULT_KILL=mid-step:2:17 LLMC_FAULT_STALL_LAUNCH2=in-split:1 \
LLMC_FAULT_FLIP_BIT_LAUNCH3=1:30:ln2w:0:5:12 LLMC_FAULT_KILL_LAUNCH4=in-async-save:0:40 scripts/supervise --ranks 4 \
    --max-restarts 4 -- "$binary" "${flags[@]}" --batch-size 1 --tp 2 --zero 2 --checkpoint-every 5 --checkpoint-async \
    --keep-checkpoints 3 --check-replicas 10 --straggler-factor 1.5 --collective-timeout 5 --output-dir "$work/five" \
    >"$work/five.out" 2>&1
status=$?
wall=$(/usr/bin/python3 -c "import time; print(f'{time.time() - $start:.1f}')")
sed 's/^/  /' "$work/five/supervisor.log"
echo "the supervised job: status $status, $wall s wall time"
mpirun --oversubscribe --allow-run-as-root -np 1 "$binary" "${flags[@]}" --batch-size 1 --output-dir "$work/one" \
    >"$work/one.out" 2>&1 || { echo "the uninterrupted run failed: $(grep -m1 error: "$work/one.out")"; exit 1; }
/usr/bin/python3 - "$work" <<'EOF'
import json, sys
def losses(name):
    found = {}
    for line in open(f"{sys.argv[1]}/{name}/log.jsonl"):
        event = json.loads(line)
        if event.get("event") == "step":
            found[event["step"]] = event["loss"]  # the last value of a step is the one kept
    return [found.get(s) for s in range(1, 61)]
one, five = losses("one"), losses("five")
error = max(abs(b - a) / abs(a) for a, b in zip(one, five)) if None not in one + five else float("inf")
print(f"the 60 losses against one uninterrupted rank: at most {error:.2e} relative "
      f"({'within' if error <= 1e-5 else 'NOT within'} 1e-5); last loss {five[-1]}")
sys.exit(0 if error <= 1e-5 else 1)
EOF
result=$?
[[ $status -eq 0 && $result -eq 0 ]]
