#!/usr/bin/env bash
# Runs that heal themselves, on the CPU build under mpirun:
#   the supervisor   scripts/supervise starts dp 2 x tp 2 at ZeRO-2 on 4 ranks (one rank per host), checkpoints every
#                    2 steps of 8. Launch 1: rank 2 killed mid-step 6 (LLMC_FAULT_KILL). The supervisor leaves its
#                    host out and relaunches on the 3 left in the planner's layout; launch 2: its rank 1 stalls in
#                    the first split (LLMC_FAULT_STALL_LAUNCH2, the watchdog names it), and the 2 left finish from
#                    the checkpoint of step 4, unattended. Steps 5-8 must match an uninterrupted run on one rank
#                    within 1e-5 (FP32: layouts change only the order of additions, as in test_faults.sh's move);
#                    the supervisor's log has one line per restart and the goodput; its Slurm dry run shows each
#                    srun with the failed nodes in --exclude
#   five faults      one supervised job of 12 steps on 4 ranks: a straggler (logged, no restart), a kill mid-step, a
#                    stall, a bit flip (the job resumes from a checkpoint the replica check saw clean), a kill during
#                    an asynchronous save; it finishes on 1 rank, its losses within 1e-5 of one uninterrupted rank's
#   Young-Daly       --checkpoint-every auto --mtbf-hours H (0.001 h = 3.6 s: an interval of a few of the 12 steps
#                    here, whatever the load): the logged interval is sqrt(2 x save s x H x 3600) over the step time,
#                    from the numbers logged beside it, and the checkpoints fall at the steps it gives
#   usage: scripts/test/test_supervise.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")
supervise=$(cd "$(dirname "$0")/.." && pwd)/supervise
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

folded_data "$work/data" 512
# one row of 16 tokens per rank and micro-step, 192 tokens a step: 4, 3, 2 and 1 data-parallel ranks all divide it
flags=(--layers 2 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16 --total-batch-size 192
       --lr-schedule constant --learning-rate 1e-3 --val-every 0 --sample-tokens 0 --save-model 0
       --train-data "$work/data/train.bin")

# ---------------------------------------------------------------------------------------------------------
echo "a killed rank and a stalled one: the supervisor finishes the run on the ranks left"
run_layout one 1 1 --steps 12  # (the reference of both supervised runs: 8 steps, then 12)
LLMC_FAULT_KILL=mid-step:2:6 LLMC_FAULT_STALL_LAUNCH2=in-split:1 timeout -k 5 120 "$supervise" --ranks 4 \
    --max-restarts 3 --dry-run slurm -- "$binary" --model custom "${flags[@]}" --batch-size 1 --tp 2 --zero 2 \
    --steps 8 --checkpoint-every 2 --keep-checkpoints 2 --collective-timeout 5 --output-dir "$work/healed" \
    >"$work/healed.out" 2>&1
status=$?
log="$work/healed/supervisor.log"
cat "$log" 2>/dev/null | sed 's/^/       /'
if [[ $status -eq 0 ]] && grep -q "fault injected: rank 2 killed at mid-step of step 6" "$work/healed/launch1.out" &&
    grep -q "fault injected: rank 1 stalls at in-split" "$work/healed/launch2.out" &&
    [[ ! -e $work/healed/launch4.out ]]; then
    ok "the supervised run completed (status 0) after the kill in launch 1 and the stall in launch 2, in 3 launches"
else
    bad "the supervised run: status $status: $(tail -5 "$work/healed.out")"
fi
restart1=$(grep '^restart 1:' "$log") restart2=$(grep '^restart 2:' "$log")
[[ $restart1 == *"exited on signal 9"*"host(s) 2 left out; resumed from step 4, 1 step(s) redone, "*" s lost; dp 2 x pp 1 x cp 1 x tp 2 (ZeRO 2) on 4 ranks -> dp 3 x pp 1 x cp 1 x tp 1 "*" on 3 ranks" ]] &&
    ok "restart 1: the killed rank's host left out, step 5 redone, 4 ranks -> 3 in the planner's layout" ||
    bad "restart 1: $restart1"
[[ $restart2 == *"rank 1 did not arrive"*"host(s) 1 left out; resumed from step 4, 0 step(s) redone, "*" s lost; "*" on 3 ranks -> "*" on 2 ranks" ]] &&
    ok "restart 2: the stalled rank (rank 1 of launch 2, host 1) named by the watchdog and left out, 3 ranks -> 2" ||
    bad "restart 2: $restart2"
grep -q "resumed from .*checkpoint_4.bin at step 4" "$work/healed/launch3.out" &&
    ok "launch 3 resumed from the complete checkpoint of step 4" || bad "launch 3: $(grep -v '^ ' "$work/healed/launch3.out" | head)"
goodput=$(grep '^goodput:' "$log")
[[ $goodput == "goodput: 1536 useful tokens (8 steps x 192) in "*" tokens/s; 2 failure(s), time lost "*"; 1 step(s) redone; checkpoint interval 2 step(s)" ]] &&
    ok "goodput: useful tokens (8 steps, none counted twice) over the wall time, the time lost per failure" ||
    bad "goodput: $goodput"
srun1=$(grep '^launch 1 (dry run' "$log") srun2=$(grep '^launch 2 (dry run' "$log") srun3=$(grep '^launch 3 (dry run' "$log")
[[ $srun1 == *": srun --nodes=4 --ntasks=4 --ntasks-per-node=1 $binary "* && $srun1 != *--exclude* &&
   $srun2 == *": srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --exclude=node2 $binary "*"--tp 1 "* &&
   $srun3 == *": srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --exclude=node2,node1 $binary "*"--resume" ]] &&
    ok "the Slurm dry run: srun within the allocation, the failed nodes left out by --exclude" ||
    bad "the Slurm dry run: $srun1 / $srun2 / $srun3"
# matches_one NAME STEPS: a supervised run's losses against one uninterrupted rank's, within 1e-5 relative (FP32:
# layouts change only the order of additions). Its log.jsonl holds every launch's steps; the last value of each
# step is the one kept.
matches_one() {
    local error
    error=$(/usr/bin/python3 - "$work" "$1" "$2" <<'EOF'
import json, sys
def losses(name):
    found = {}
    for line in open(f"{sys.argv[1]}/{name}/log.jsonl"):
        event = json.loads(line)
        if event.get("event") == "step":
            found[event["step"]] = event["loss"]
    return [found.get(s) for s in range(1, int(sys.argv[3]) + 1)]
one, healed = losses("one"), losses(sys.argv[2])
print(max(abs(b - a) / abs(a) for a, b in zip(one, healed)) if None not in one + healed else "inf")
EOF
)
    /usr/bin/python3 -c "import sys; sys.exit(0 if float('$error') <= 1e-5 else 1)" &&
        ok "the $1 run's $2 losses within $error relative of one uninterrupted rank (tol 1e-5, FP32)" ||
        bad "the $1 run's losses differ from one rank's by $error relative"
}
matches_one healed 8
"$supervise" --ranks 3 --ranks-per-host 2 -- "$binary" >"$work/bad_hosts.out" 2>&1
[[ $? -ne 0 ]] && one=$(grep '^error:' "$work/bad_hosts.out") && [[ $one == *"not a whole number of hosts"* ]] &&
    ok "bad input: $one" || bad "3 ranks in hosts of 2: $(cat "$work/bad_hosts.out")"

# ---------------------------------------------------------------------------------------------------------
echo "five faults in one supervised job: a kill, a stall, a bit flip, a kill in an asynchronous save, a straggler"
# 4 ranks -> 3 -> 2 -> 2 -> 1, 12 steps, a checkpoint every 2 (asynchronous), the replicas checked every 4 steps:
#   launch 1  rank 3 computes 3x as long (LLMC_FAULT_SLOW): named by --straggler-factor, logged, no restart;
#             rank 2 killed mid-step 5
#   launch 2  rank 1 stalls in its first split: the watchdog names it
#   launch 3  rank 1 flips a bit of ln2w after step 8's update; the check of step 8 finds the copies differ (two
#             copies: no majority, no host named). The supervisor knows only that the check of step 4 passed, so
#             the checkpoint of step 6 is set aside and the job resumes from step 4's. (The flip is made at a step
#             the check runs: under ZeRO 1, this layout, the next all-gather of the updated shards would copy the
#             flipped value to every rank or overwrite it, and no later check could see it.)
#   launch 4  rank 0 killed while its writer thread writes the checkpoint of step 8: step 6's is the newest
#   launch 5  the last rank finishes, and the 12 losses must match one uninterrupted rank's
LLMC_FAULT_SLOW=3:3 LLMC_FAULT_KILL=mid-step:2:5 LLMC_FAULT_STALL_LAUNCH2=in-split:1 \
LLMC_FAULT_FLIP_BIT_LAUNCH3=1:8:ln2w:0:5:12 LLMC_FAULT_KILL_LAUNCH4=in-async-save:0:8 timeout -k 5 180 "$supervise" \
    --ranks 4 --max-restarts 4 -- "$binary" --model custom "${flags[@]}" --batch-size 1 --tp 2 --zero 2 --steps 12 \
    --checkpoint-every 2 --checkpoint-async --keep-checkpoints 3 --check-replicas 4 --straggler-factor 1.5 \
    --collective-timeout 5 --output-dir "$work/five" >"$work/five.out" 2>&1
status=$?
log="$work/five/supervisor.log"
cat "$log" 2>/dev/null | sed 's/^/       /'
launched() { grep -q "$2" "$work/five/launch$1.out"; }
if [[ $status -eq 0 ]] && launched 1 "fault injected: rank 2 killed at mid-step of step 5" &&
    launched 2 "fault injected: rank 1 stalls at in-split" && launched 3 "fault injected: rank 1 flipped bit 12" &&
    launched 4 "fault injected: rank 0 killed at in-async-save of step 8" && [[ ! -e $work/five/launch6.out ]]; then
    ok "the job completed (status 0) after the four faults that stop a launch, in 5 launches"
else
    bad "the five-fault job: status $status: $(tail -5 "$work/five.out")"
fi
straggler=$(grep '^launch 1 straggler' "$log")
[[ $straggler == *"straggler: rank 3 computed "*"x the median for 3 steps"* ]] && grep -q "^restart 1: .*rank 2 with PID" "$log" &&
    ok "the slowed rank 3 named in the log as a straggler; restart 1 is for the killed rank 2, not for it" ||
    bad "the straggler: '$straggler' / $(grep '^restart 1:' "$log")"
restart=$(grep '^restart 2:' "$log")
[[ $restart == *"rank 1 did not arrive"*"host(s) 1 left out"*" on 3 ranks -> "*" on 2 ranks" ]] &&
    ok "restart 2: the stalled rank's host left out, 3 ranks -> 2" || bad "restart 2: $restart"
restart=$(grep '^restart 3:' "$log")
[[ $restart == *"silent data corruption at step 8"*"no majority"*"the replica check last passed at step 4: checkpoint(s) of step(s) 6 set aside; no host (none named) left out; resumed from step 4, "*" on 2 ranks -> "*" on 2 ranks" ]] &&
    compgen -G "$work/five/suspect/checkpoint_6.*" >/dev/null && grep -q "resumed from .*checkpoint_4.bin at step 4" "$work/five/launch4.out" &&
    ok "restart 3: the bit flip caught at step 8; step 6's checkpoint (saved after the last check that passed) set aside, step 4's resumed" ||
    bad "restart 3: $restart / $(grep resumed "$work/five/launch4.out")"
restart=$(grep '^restart 4:' "$log")
[[ $restart == *"rank 0 with PID"*"exited on signal 9"*"resumed from step 6, "*" on 2 ranks -> "*" on 1 ranks" ]] &&
    grep -q "resumed from .*checkpoint_6.bin at step 6" "$work/five/launch5.out" &&
    ok "restart 4: the save of step 8 killed, the job resumed from step 6's, the newest complete checkpoint" ||
    bad "restart 4: $restart / $(grep resumed "$work/five/launch5.out")"
goodput=$(grep '^goodput:' "$log")
[[ $goodput == "goodput: 2304 useful tokens (12 steps x 192) in "*" tokens/s; 4 failure(s), time lost "* ]] &&
    ok "goodput printed: 12 steps' tokens, 4 failures" || bad "goodput: $goodput"
matches_one five 12

# ---------------------------------------------------------------------------------------------------------
echo "--checkpoint-every auto: the Young-Daly interval"
run_layout young_daly 1 4 --steps 12 --checkpoint-every auto --mtbf-hours 1e-3 --keep-checkpoints 20
result=$(/usr/bin/python3 - "$work/young_daly/log.jsonl" <<'EOF'
import json, math, sys
events = [json.loads(line) for line in open(sys.argv[1])]
chosen = [e for e in events if e["event"] == "checkpoint_interval"]
saved = [e["step"] for e in events if e["event"] == "checkpoint"]
if len(chosen) != 1:
    sys.exit(print(f"bad: {len(chosen)} checkpoint_interval events"))
e = chosen[0]
tau = math.sqrt(2 * e["save_s"] * e["mtbf_hours"] * 3600)  # Young-Daly, in seconds
steps = max(1, round(tau / e["step_s"]))
expected = sorted({1} | set(range(1 + steps, 13, steps)) | {12})  # the first save measures C; the last step saves
good = abs(e["interval_s"] - tau) <= 1e-6 * tau and e["steps"] == steps and saved == expected
print(f"{'ok' if good else 'bad'}: save {e['save_s']:.4f} s, MTBF {e['mtbf_hours']} h, step {e['step_s']:.4f} s -> "
      f"{e['interval_s']:.4f} s = {e['steps']} steps (formula: {tau:.4f} s = {steps}); saves at {saved}, expected {expected}")
EOF
)
[[ $result == ok:* ]] && ok "${result#ok: }" || bad "${result#bad: }"
grep -q "^checkpoint interval: Young-Daly sqrt(2 x save " "$work/young_daly.out" && ok "the interval is printed" ||
    bad "no interval line: $(grep -i interval "$work/young_daly.out")"
"$binary" --model custom "${flags[@]}" --steps 2 --checkpoint-every auto --output-dir "$work/no_mtbf" >"$work/no_mtbf.out" 2>&1
[[ $? -ne 0 ]] && one=$(grep '^error:' "$work/no_mtbf.out") && [[ $one == *"--checkpoint-every auto and --mtbf-hours: give both"* ]] &&
    ok "auto without --mtbf-hours: $one" || bad "auto without --mtbf-hours: $(cat "$work/no_mtbf.out")"

finish
