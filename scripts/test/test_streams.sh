#!/usr/bin/env bash
# Are the stream waits of the training step enough? On a GPU the compute and communication streams run
# side by side, ordered only by events; the CPU device runs everything in issue order unless told
# otherwise, so a missing wait would pass every other test. Here the runs use LLMC_CPU_LATE_STREAMS
# (llmc/cpu/runtime.h): the work of every non-blocking stream waits in a queue until a wait or a sync
# forces it, so a kernel that is not ordered after its producer runs before it and computes garbage.
# Mode 1 lets the stream the host forces run ahead of the others, mode 2 lets the others run ahead of it:
# between them a missing wait on either side of the compute/communication pair shows.
# The runs: the data-parallel matrix's tiny model, on 512 token ids, with one more layer (3 blocks, so that ZeRO-3 gathers
# a block into a buffer that an earlier block of the same pass used) and its global batch (2 micro-steps
# per step, validation every 2 steps, checkpoints), on one rank, at --zero 0, 1, 2 and 3 on 2 ranks, in
# 2 x 2 hybrid sharding at --zero 3, tp 2 with sequence parallelism x dp 2 at --zero 2, a 3-stage 1f1b
# pipeline at --zero 2, ring attention at cp 2 x dp 2 at --zero 2 and at cp 2 x tp 2 with sequence
# parallelism, resumed on 2 ranks at ZeRO-3 from the 2-rank ZeRO-1 run's step-3 checkpoint, activation
# offload (llmc/model/activation_offload.cuh: the copy stream beside compute) on one rank with every block offloaded
# (3 blocks: the first staging record is reused) and on 2 ranks at ZeRO-3 with blocks o, f, o, and 2 ranks at
# --zero 3 with --offload optimizer (the state's pieces go up and down on a copy stream of their own,
# llmc/parallel/zero.h). In each mode every run must be bit-identical (losses and final parameters) to the same run
# without the flag: with every wait in place the same operations see the same data in the same order.
# (Bit for bit, not within a tolerance: a missing wait can merely reorder additions - two micro-steps'
# gradients summed in a working buffer before its reduction instead of after it.) The runs without the
# flag must match one rank within 1e-5, as in the data-parallel matrix.
# Given a BF16 build too, a 2-rank ZeRO-3 run in the first mode must be bit-identical to one without it.
# LATE_STREAMS_MODES=0 runs only the checks without the flag (scripts/test/mutate_waits.sh uses it to show
# that a deleted wait goes unnoticed there).
#   usage: scripts/test/test_streams.sh ./train_gpt_fp32_cpu [./train_gpt_cpu]
set -u
binary=${1:?usage: $0 TRAIN_BINARY [BF16_TRAIN_BINARY]}
bf16_binary=${2:-}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
modes=${LATE_STREAMS_MODES:-1 2}
late_modes=${modes//0/}

# the classics folded into 512 token ids (test_lib.sh's folded_data): the waits between streams are this suite's
# subject, and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--model custom --layers 3 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 2 --val-batches 2 --sample-tokens 0
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin" --total-batch-size 256)
run() {  # run NAME MODE RANKS ZERO DP_SHARD [FLAGS...]: B = 8 / data-parallel ranks (RANKS / (tp pp cp)) rows per
         # rank and micro-step, 5 steps
    local name=$1 mode=$2 ranks=$3 zero=$4 shard=$5 tp=1 pp=1 cp=1
    shift 5
    [[ " $* " =~ " --tp "([0-9]+) ]] && tp=${BASH_REMATCH[1]}
    [[ " $* " =~ " --pp "([0-9]+) ]] && pp=${BASH_REMATCH[1]}
    [[ " $* " =~ " --cp "([0-9]+) ]] && cp=${BASH_REMATCH[1]}
    LLMC_CPU_LATE_STREAMS=$mode mpirun --oversubscribe --allow-run-as-root -x LLMC_CPU_LATE_STREAMS -x OMP_NUM_THREADS \
        -np "$ranks" "${run_binary:-$binary}" "${flags[@]}" --steps 5 --batch-size $((8 * tp * pp * cp / ranks)) --zero "$zero" \
        --dp-shard "$shard" --output-dir "$work/$name" "$@" >>"$work/$name.out" 2>&1 ||
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
}
same_losses() {  # same_losses A B COUNT: COUNT losses and the final parameters, bit for bit
    [[ $(logged_losses "$1" | wc -l) -eq $3 && "$(logged_losses "$1")" == "$(logged_losses "$2")" ]] &&
        cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}

# name:ranks:zero:dp-shard[:more flags, commas for spaces]. The tp layout's collectives run on the compute
# stream, beside ZeRO-2's reductions on the communication stream; so do the pipeline's sends and receives
# (3 stages of one layer, 1f1b over 2 microbatches), and ring attention's key/value blocks on a stream of
# their own (cp 2 x dp 2, ZeRO-2; and cp 2 x tp 2 with sequence parallelism, ZeRO-1 over the cp pair)
layouts="one:1:0:1 zero0:2:0:2 zero1:2:1:2 zero2:2:2:2 zero3:2:3:2 hsdp3_2x2:4:3:2
         tp2_sp_zero2:4:2:2:--tp,2,--sequence-parallel pp3_zero2:3:2:1:--pp,3 cp2_ring_zero2:4:2:2:--cp,2
         cp2_tp2_sp_zero1:4:1:1:--cp,2,--tp,2,--sequence-parallel offload_one:1:0:1:--offload,activations
         offload_zero3:2:3:2:--recompute-blocks,ofo offload_optimizer_zero3:2:3:2:--offload,optimizer"
for mode in 0 $late_modes; do
    for layout in $layouts; do
        IFS=: read -r name ranks zero shard layout_flags <<<"$layout"
        extra=(--checkpoint-every 5 ${layout_flags//,/ })
        [[ $name == zero1 ]] && extra=(--checkpoint-every 3 --keep-checkpoints 5)
        run "${name}_$mode" "$mode" "$ranks" "$zero" "$shard" "${extra[@]}"
    done
    mkdir -p "$work/resumed_$mode" && cp "$work/zero1_$mode"/checkpoint_3* "$work/resumed_$mode/" 2>/dev/null
    run "resumed_$mode" "$mode" 2 3 2 --resume
done

echo "without the flag vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" $layouts >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import compare_run, report, result
work, layouts = sys.argv[1], [l.split(":") for l in sys.argv[2:] if not l.startswith("one:")]
results = []
for name, ranks, zero, shard in (l[:4] for l in layouts):
    try:  # 5 training and 4 validation losses
        good, words = compare_run(work, f"{name}_0", "one_0", steps=5, validations=4)
    except Exception as error:  # a run that failed left no log or no model
        good, words = False, f"no result ({error})"
    results.append(report(good, f"{name:9} {ranks} ranks, zero {zero}, dp-shard {shard}: {words}"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"
add_python_result "$work/compare.out"

for mode in $late_modes; do
    echo "LLMC_CPU_LATE_STREAMS=$mode vs the same runs without it"
    for layout in $layouts resumed:2:3:2; do
        IFS=: read -r name ranks zero shard _ <<<"$layout"
        count=9 what="$ranks rank(s), zero $zero, dp-shard $shard: 5 training and 4 validation losses"
        [[ $name == resumed ]] && count=4 what="2 ranks at zero 3, resumed from zero 1's step 3: 4 losses"
        if same_losses "${name}_$mode" "${name}_0" "$count"; then
            ok "$name: $what and the final parameters bit-identical"
        else
            bad "$name: $what or the final parameters differ"
        fi
    done
done

if [[ -n "$bf16_binary" && -n "${late_modes// /}" ]]; then
    mode=$(echo $late_modes | cut -d' ' -f1)
    run_binary=$bf16_binary run bf16_0 0 2 3 2
    run_binary=$bf16_binary run "bf16_$mode" "$mode" 2 3 2
    if same_losses "bf16_$mode" bf16_0 9; then
        ok "BF16, 2 ranks, zero 3: losses and final parameters with LLMC_CPU_LATE_STREAMS=$mode bit-identical to without"
    else
        bad "BF16, 2 ranks, zero 3: LLMC_CPU_LATE_STREAMS=$mode changes the losses or the final parameters"
    fi
fi
finish
