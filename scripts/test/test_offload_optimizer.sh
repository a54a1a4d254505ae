#!/usr/bin/env bash
# --offload optimizer gives the same bits as without it (llmc/parallel/zero.h: the master weights and AdamW's
# moments in pinned host memory, streamed in pieces through the device's own AdamW kernel). A 3-block model, 4
# steps of 2 micro-steps; every run with the flag must leave the training and validation losses in log.jsonl
# and model.bin bit for bit equal to the same run without it: on one rank, at dp 2 with ZeRO 0, 1, 2 and 3,
# in 2 x 2 hybrid sharding at ZeRO-3, at pp 2 (1f1b, ZeRO-1) and at tp 2 with sequence parallelism, the dp
# runs with the replica check on every step. The embedding chunk is larger than a block's, so it goes up in
# several pieces: tensors cut between pieces are covered. Checkpoints: a run resumed at step 2 with the flag
# from a checkpoint written without it, and one resumed without it from a checkpoint written with it, continue
# exactly as the uninterrupted run; resumed at ZeRO-3 from ZeRO-1's checkpoint (resharded), with and without
# the flag alike. The replica check still catches a flipped bit with the flag. The held host and device bytes
# equal llmc/planning/memory.h's formula, and every step keeps the README's host-call budget (the state's
# downloads are the only extra copies, and no synchronisation is added).
# Given a BF16 build too (where the master weights move as well): one rank and dp 2 at ZeRO-3, bit for bit.
#   usage: scripts/test/test_offload_optimizer.sh ./train_gpt_fp32_cpu [./train_gpt_cpu]
set -u
binary=${1:?usage: $0 TRAIN_BINARY [BF16_TRAIN_BINARY]}
bf16_binary=${2:-}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 512 token ids (test_lib.sh's folded_data): the optimizer's state is this suite's subject,
# and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time. The embedding
# chunk, 512 x 32 + 32 x 32, still exceeds a block's 12 x 32^2 + 13 x 32, so it goes up in 2 pieces, wte cut between them
folded_data "$work/data" 512
flags=(--model custom --layers 3 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 2 --val-batches 2 --sample-tokens 0
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin" --total-batch-size 256)
run() {  # run NAME BINARY RANKS [FLAGS...]: 16 rows per step, B = 8 tp pp / RANKS rows per rank and micro-step
    local name=$1 program=$2 ranks=$3 tp=1 pp=1
    shift 3
    [[ " $* " =~ " --tp "([0-9]+) ]] && tp=${BASH_REMATCH[1]}
    [[ " $* " =~ " --pp "([0-9]+) ]] && pp=${BASH_REMATCH[1]}
    local steps=(--steps 4)
    [[ " $* " == *" --steps "* ]] && steps=()
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$program" "${flags[@]}" "${steps[@]}" \
        --batch-size $((8 * tp * pp / ranks)) --output-dir "$work/$name" "$@" >>"$work/$name.out" 2>&1 ||
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
}
same_bits() {  # same_bits A B COUNT: COUNT losses (training and validation) and model.bin, bit for bit
    [[ $(logged_losses "$1" | wc -l) -eq $3 && "$(logged_losses "$1")" == "$(logged_losses "$2")" ]] &&
        cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}
memory() {  # memory RUN FIELD: a number from the run's memory line
    PYTHONPATH="$(dirname "$0")" /usr/bin/python3 -c "from layout_check import events; print(events('$work', '$1', 'memory')[-1]['$2'])"
}

echo "with --offload optimizer vs without, FP32 ($binary)"
# name:ranks:flags (commas for spaces)
layouts="one:1: zero0:2:--zero,0,--check-replicas,1 zero1:2:--zero,1,--check-replicas,1
         zero2:2:--zero,2,--check-replicas,1 zero3:2:--zero,3,--check-replicas,1
         hsdp3_2x2:4:--zero,3,--dp-shard,2,--check-replicas,1 pp2_zero1:2:--pp,2,--zero,1
         tp2_sp:2:--tp,2,--sequence-parallel"
for layout in $layouts; do
    IFS=: read -r name ranks layout_flags <<<"$layout"
    run "$name" "$binary" "$ranks" ${layout_flags//,/ }
    run "${name}_offload" "$binary" "$ranks" ${layout_flags//,/ } --offload optimizer
    if same_bits "${name}_offload" "$name" 7; then
        ok "$name: 4 training and 3 validation losses and model.bin bit-identical with the optimizer offloaded"
    else
        bad "$name: the losses or model.bin differ with the optimizer offloaded"
    fi
    host_calls_within_budget "${name}_offload"
done

echo "memory held against the formula (one rank, FP32)"
host=$(memory one_offload host_optimizer_bytes) host_formula=$(memory one_offload host_optimizer_formula_bytes)
device=$(memory one_offload model_state_bytes) device_formula=$(memory one_offload formula_with_buffers_bytes)
device_plain=$(memory one model_state_bytes)
if /usr/bin/python3 -c "import sys; sys.exit(0 if $host == $host_formula and $host > 0 and $device == $device_formula else 1)"; then
    ok "pinned host memory $host B == formula; device model state $device B == formula (without offload $device_plain B)"
else
    bad "host $host B (formula $host_formula), device model state $device B (formula $device_formula)"
fi

echo "checkpoints across offload and no offload"
for kind in plain offload; do
    extra=()
    [[ $kind == offload ]] && extra=(--offload optimizer)
    run "saved_$kind" "$binary" 2 --zero 1 --checkpoint-every 2 --keep-checkpoints 5 "${extra[@]}"
done
if same_bits saved_offload saved_plain 7; then
    ok "2 ranks, ZeRO-1, checkpoints every 2 steps: with and without offload bit-identical"
else
    bad "2 ranks, ZeRO-1, checkpoints every 2 steps: offload changes the run"
fi
resume() {  # resume NAME FROM [FLAGS...]: 2 ranks resumed from step 2's checkpoint of run FROM
    local name=$1 from=$2
    shift 2
    mkdir -p "$work/$name" && cp "$work/$from"/checkpoint_2* "$work/$name/" 2>/dev/null
    run "$name" "$binary" 2 --resume "$@"
}
continues() {  # continues RESUMED FULL: the resumed run's losses are the uninterrupted run's last ones, model.bin too
    local count
    count=$(logged_losses "$1" | wc -l)
    [[ $count -ge 3 && "$(logged_losses "$1")" == "$(logged_losses "$2" | tail -n "$count")" ]] &&
        cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}
resume plain_to_offload saved_plain --zero 1 --offload optimizer
resume offload_to_plain saved_offload --zero 1
for pair in "plain_to_offload saved_plain" "offload_to_plain saved_offload"; do
    read -r resumed full <<<"$pair"
    if continues "$resumed" "$full"; then
        ok "$resumed: resumed at step 2, the remaining losses and model.bin equal the uninterrupted run's"
    else
        bad "$resumed: resumed at step 2, does not continue as the uninterrupted run"
    fi
done
resume resharded_offload saved_offload --zero 3 --offload optimizer
resume resharded_plain saved_offload --zero 3
if [[ $(logged_losses resharded_offload | wc -l) -ge 3 && "$(logged_losses resharded_offload)" == "$(logged_losses resharded_plain)" ]] &&
   cmp -s "$work/resharded_offload/model.bin" "$work/resharded_plain/model.bin"; then
    ok "resumed at ZeRO-3 from ZeRO-1's checkpoint (resharded): with and without offload bit-identical"
else
    bad "resumed at ZeRO-3 from ZeRO-1's checkpoint: offload changes the resharded run"
fi

echo "the replica check with the optimizer offloaded"
out="$work/flipped.out"
LLMC_FAULT_FLIP_BIT=1:2:ln1w:0:3:20 mpirun --oversubscribe --allow-run-as-root -x LLMC_FAULT_FLIP_BIT -np 2 "$binary" \
    "${flags[@]}" --steps 4 --batch-size 4 --zero 1 --check-replicas 1 --offload optimizer --output-dir "$work/flipped" \
    >"$out" 2>&1
status=$?
if [[ $status -ne 0 ]] && grep -q "silent data corruption at step 2" "$out"; then
    ok "a bit flipped on rank 1 after step 2's update: $(grep -m1 'silent data corruption' "$out" | sed 's/^error: //')"
else
    bad "a flipped bit with the optimizer offloaded: exit $status, $(grep -m1 error: "$out")"
fi

if [[ -n $bf16_binary ]]; then
    echo "with --offload optimizer vs without, BF16 ($bf16_binary): the master weights move too"
    for layout in one:1: zero3:2:--zero,3; do
        IFS=: read -r name ranks layout_flags <<<"$layout"
        run "bf16_$name" "$bf16_binary" "$ranks" ${layout_flags//,/ }
        run "bf16_${name}_offload" "$bf16_binary" "$ranks" ${layout_flags//,/ } --offload optimizer
        if same_bits "bf16_${name}_offload" "bf16_$name" 7; then
            ok "BF16 $name: losses and model.bin bit-identical with the optimizer offloaded"
        else
            bad "BF16 $name: the losses or model.bin differ with the optimizer offloaded"
        fi
    done
fi
finish
