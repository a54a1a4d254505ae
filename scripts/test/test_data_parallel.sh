#!/usr/bin/env bash
# Data parallelism and ZeRO against one rank: the same model, the same global batch (16 rows of 16 tokens,
# as 2 micro-steps of 8 rows), the same steps, on 2 and 4 ranks with --zero 0, 1, 2 and 3, and hybrid
# sharding 2 x 2 with stages 1, 2 and 3 (mpirun, CPU build, FP32). The losses of every step and the final parameters must agree with the
# single rank's within 1e-5 relative: only the order of the additions in the gradient average differs.
# Also compares the bytes each rank sent per step with the ring algorithms' theory (llmc/parallel/zero.h).
# Given a BF16 build too, checks that ZeRO stages 0-3 give bit-identical BF16 runs (see the end).
#   usage: scripts/test/test_data_parallel.sh ./train_gpt_fp32_cpu [./train_gpt_cpu]
set -u
binary=${1:?usage: $0 TRAIN_BINARY [BF16_TRAIN_BINARY]}
bf16_binary=${2:-}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 8192 token ids (test_lib.sh's folded_data): the layouts are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time. Not 512, as the other
# layout suites: on this 32-channel model the embedding would no longer be most of the parameters, and measured at
# 512 the 4-rank layouts' final parameters came 9e-6 from one rank's (AdamW's normalised steps on the rows of rare
# ids; the tolerance is 1e-5) and the loss's and the norm's small all-reduces 1.5% of the bytes (the formulas'
# tolerance is 1%); at 8192, 8.6e-7 and 0.22% at most (at 50,257: 2e-7 and 0.04%)
folded_data "$work/data" 8192
flags=(--model custom --layers 2 --heads 2 --channels 32 --vocab-size 8192 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 0
       --sample-tokens 0 --train-data "$work/data/train.bin")
run() {  # run NAME RANKS ZERO DP_SHARD [FLAGS...]: B = 8 / RANKS rows per rank and micro-step; 5 steps and
         # 256 tokens per step unless given
    local name=$1 ranks=$2 zero=$3 shard=$4
    shift 4
    local extra=("$@")
    [[ " ${extra[*]} " == *" --steps "* ]] || extra+=(--steps 5)
    [[ " ${extra[*]} " == *" --total-batch-size "* ]] || extra+=(--total-batch-size 256)
    if mpirun --oversubscribe --allow-run-as-root -np "$ranks" "${run_binary:-$binary}" "${flags[@]}" --batch-size $((8 / ranks)) \
        --zero "$zero" --dp-shard "$shard" --output-dir "$work/$name" "${extra[@]}" >>"$work/$name.out" 2>&1; then
        steady_steps "${extra[@]}" && host_calls_within_budget "$name"
    else
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
    fi
}
run one 1 0 1
layouts="zero0_2:2:0:2 zero0_4:4:0:4 zero1_2:2:1:2 zero1_4:4:1:4 zero2_2:2:2:2 zero2_4:4:2:4 zero3_2:2:3:2
         zero3_4:4:3:4 hsdp1_2x2:4:1:2 hsdp2_2x2:4:2:2 hsdp3_2x2:4:3:2"
for layout in $layouts; do IFS=: read -r name ranks zero shard <<<"$layout"; run "$name" "$ranks" "$zero" "$shard"; done

# checkpoints across layouts: saved at step 3 by 4 ranks at ZeRO-1 (4 shard files), resumed from there by 2
# ranks at ZeRO-3 and by 1 rank at ZeRO-0; the last 2 steps must match the uninterrupted single rank
run saved 4 1 4 --checkpoint-every 3 --keep-checkpoints 5
for name in resumed_zero3 resumed_one; do
    mkdir -p "$work/$name" && cp "$work"/saved/checkpoint_3* "$work/$name/"
done
run resumed_zero3 2 3 2 --resume
run resumed_one 1 0 1 --resume
# killed: 4 ranks at ZeRO-2 with a checkpoint every 2 steps are killed with SIGKILL once a checkpoint
# exists, then resumed from the newest complete checkpoint; their 12 losses must match an uninterrupted run
run one_long 1 0 1 --steps 12
mpirun --oversubscribe --allow-run-as-root -np 4 "$binary" "${flags[@]}" --batch-size 2 --total-batch-size 256 --zero 2 --dp-shard 4 \
    --steps 12 --checkpoint-every 2 --output-dir "$work/killed" >"$work/killed.out" 2>&1 &
for _ in $(seq 1 600); do [[ -f "$work/killed/checkpoint_4.bin" ]] && break; sleep 0.05; done
# every process of that run (mpirun and its ranks) has the run's unique output directory in its arguments
pkill -KILL -f -- "--output-dir $work/killed" 2>/dev/null
wait 2>/dev/null  # (no "Killed" job notice)
for _ in $(seq 1 100); do pgrep -f -- "--output-dir $work/killed" >/dev/null || break; sleep 0.05; done
killed_at=$(ls "$work/killed" | sed -n -E 's/^checkpoint_([0-9]+)\.bin$/\1/p' | sort -n | tail -n 1)
run killed 4 2 4 --steps 12 --checkpoint-every 2 --resume

echo "data parallelism vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" "${killed_at:-none}" $layouts >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import compare_resumed, compare_run, events, report, result
work, killed_at, layouts = sys.argv[1], sys.argv[2], [l.split(":") for l in sys.argv[3:]]
# the parameter buffer as the program lays it out: chunks padded to a multiple of 8 x shards elements
L, C, Vp, maxT = 2, 32, 8192, 32
chunks = [Vp * C + maxT * C] + [12 * C * C + 13 * C] * L + [2 * C]
def padded_total(shards):
    return sum((c + 8 * shards - 1) // (8 * shards) * (8 * shards) for c in chunks)
results = []
for name, ranks, zero, shard in layouts:
    ranks, zero, shard = int(ranks), int(zero), int(shard)
    same_run, run_words = compare_run(work, name, "one", steps=5)
    sent = events(work, name, "step")[-1]["comm_bytes"]
    if zero == 0:   # all-reduce of the whole gradient
        P = padded_total(1)
        theory = 2 * (ranks - 1) / ranks * P * 4
        formula = f"2(N-1)/N x {P} x 4"
    else:
        # reduce-scatter within K (stages 2-3: every micro-step, A = 2), the all-gather of the parameters
        # within K, and the all-reduce of the shard across the M groups. Stage 3 gathers a chunk when a
        # buffer does not hold it: with this 2-layer model both blocks fit the two block buffers, so each
        # chunk is gathered once per step, as at stages 1-2 (a deep model gathers each block twice).
        K, M, A = shard, ranks // shard, (2 if zero >= 2 else 1)
        P = padded_total(K)
        theory = ((A + 1) * (K - 1) / K + 2 * (M - 1) / M / K) * P * 4
        formula = f"(({A}+1)(K-1)/K + 2(M-1)/(MK)) x {P} x 4"
    comm_error = abs(sent - theory) / theory
    # memory of rank 0: parameters + gradients + optimizer state held, against the ZeRO formula plus the
    # working buffers llmc/parallel/zero.h keeps (one per chunk kind: with this model's chunks they add up to about
    # the whole model, so the buffers matter)
    memory = events(work, name, "memory")[-1]
    held, planned = memory["model_state_bytes"], memory["formula_with_buffers_bytes"]
    memory_error = abs(held - planned) / planned
    results.append(report(same_run and comm_error <= 0.01 and memory_error <= 0.05,
                          f"{name:9} {ranks} ranks, zero {zero}, dp-shard {shard}: {run_words}; sent {sent} B/step, "
                          f"theory {formula} = {theory:.0f} ({100 * comm_error:.3f}%); model state held {held} B, ZeRO "
                          f"formula {memory['formula_bytes']:.0f} + working buffers = {planned:.0f} "
                          f"({100 * memory_error:.2f}%, tol 5%)"))

# resumed runs: the steps after the checkpoint, and the final parameters
results.append(compare_resumed(work, "resumed_zero3", "one", 3, "saved by 4 ranks at ZeRO-1, resumed by 2 ranks at ZeRO-3"))
results.append(compare_resumed(work, "resumed_one", "one", 3, "saved by 4 ranks at ZeRO-1, resumed by 1 rank"))
if killed_at.isdigit() and 0 < int(killed_at) < 12:
    results.append(compare_resumed(work, "killed", "one_long", int(killed_at),
                                   f"4 ranks at ZeRO-2 killed (SIGKILL), resumed from step {killed_at}"))
else:
    results.append(report(False, f"the 4-rank run was not killed mid-training (newest checkpoint: {killed_at})"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"

# BF16, 2 ranks, no gradient accumulation, no clipping: every ZeRO stage adds the same numbers in the same
# order (a sum of two gradients is the same either way round, and the stochastic rounding hashes each
# element's index within its tensor, not within the rank's shard), so losses and final parameters must be
# bit-identical. Accumulation adds the micro-steps before the reduction at stages 0-1 and after it at 2-3,
# and clipping sums the squared norm per shard: both reorder float additions, so they stay off here.
if [[ -n "$bf16_binary" ]]; then
    for zero in 0 1 2 3; do
        run_binary=$bf16_binary run "bf16_zero$zero" 2 "$zero" 2 --total-batch-size 128 --grad-clip 0
    done
    losses() { grep -o '"loss": [^,]*' "$work/$1/log.jsonl"; }
    for zero in 1 2 3; do
        if [[ $(losses bf16_zero0 | wc -l) -eq 5 && "$(losses bf16_zero0)" == "$(losses bf16_zero$zero)" ]] &&
            cmp -s "$work/bf16_zero0/model.bin" "$work/bf16_zero$zero/model.bin"; then
            ok "BF16, 2 ranks: zero $zero's 5 losses and final parameters are bit-identical to zero 0's"
        else
            bad "BF16, 2 ranks: zero $zero's losses or final parameters differ from zero 0's"
        fi
    done
fi
add_python_result "$work/compare.out"
finish
