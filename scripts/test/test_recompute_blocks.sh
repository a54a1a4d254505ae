#!/usr/bin/env bash
# Per-block recomputation and activation offload give the same bits as none (llmc/parallel/recompute.h,
# llmc/model/activation_offload.cuh): mixes of the letters k (keep), s (selective), f (full) and o (offload) over
# a 4-block model's stage records, and every block offloaded (--offload activations), must give training and
# validation losses and a final model.bin bit-identical to --recompute none: on one rank, on 2 data-parallel
# ranks at ZeRO-1 and ZeRO-3 (the reruns gather the parameters again), on a 2-stage 1f1b pipeline (records of
# 2 blocks, 2 microbatches in flight, each offloaded) and under zb-h1 (the backward split into B and W), and at
# tp 2 with sequence parallelism. The memory report of the offloaded runs: the host holds what the formula says
# to the byte, and the device holds less than without offload. Bad letters, a wrong count and an offloaded
# mixture of experts are refused with one line.
#   usage: scripts/test/test_recompute_blocks.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 512 token ids (test_lib.sh's folded_data): the blocks' records are this suite's subject,
# and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--model custom --layers 4 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --val-batches 2 --sample-tokens 0 --steps 3
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin" --total-batch-size 256)
run() {  # run NAME RANKS BLOCKS [FLAGS...]: BLOCKS none, all-o (--offload activations) or letters; B = 8 rows
         # per data-parallel rank and micro-step
    local name=$1 ranks=$2 blocks=$3 tp=1 pp=1
    shift 3
    [[ " $* " =~ " --tp "([0-9]+) ]] && tp=${BASH_REMATCH[1]}
    [[ " $* " =~ " --pp "([0-9]+) ]] && pp=${BASH_REMATCH[1]}
    local policy=(--recompute none)
    [[ $blocks == all-o ]] && policy=(--offload activations)
    [[ $blocks != none && $blocks != all-o ]] && policy=(--recompute-blocks "$blocks")
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" \
        --batch-size $((8 * tp * pp / ranks)) "${policy[@]}" --output-dir "$work/$name" "$@" >"$work/$name.out" 2>&1 ||
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
}
same_bits() {  # same_bits A B: 3 training and 2 validation losses, and model.bin, bit for bit
    [[ $(logged_losses "$1" | wc -l) -eq 5 && "$(logged_losses "$1")" == "$(logged_losses "$2")" ]] &&
        cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}
field() {  # field RUN EVENT FIELD: a number from the run's last EVENT line
    PYTHONPATH="$(dirname "$0")" /usr/bin/python3 -c \
        "from layout_check import events; print(events('$work', '$1', '$2')[-1]['$3'])" 2>/dev/null
}

# where:ranks:flags (commas for spaces, slashes for commas):mixes (pp 2: stages of 2 blocks, records of 2)
layouts=("one:1::kfso sfok all-o" "zero1:2:--zero,1:kfso all-o" "zero3:2:--zero,3:sfok all-o"
         "pp2_1f1b:2:--pp,2,--pp-layers,2/2,--pp-schedule,1f1b:fo sk all-o"
         "pp2_zbh1:2:--pp,2,--pp-layers,2/2,--pp-schedule,zb-h1:of all-o"
         "tp2_sp:2:--tp,2,--sequence-parallel:kfso all-o")
echo "per-block recomputation and offload vs none, FP32 ($binary)"
for layout in "${layouts[@]}"; do
    IFS=: read -r where ranks layout_flags mixes <<<"$layout"
    layout_flags=${layout_flags//,/ }
    layout_flags=${layout_flags//\//,}
    run "${where}_none" "$ranks" none $layout_flags
    for blocks in $mixes; do
        run "${where}_$blocks" "$ranks" "$blocks" $layout_flags
        if same_bits "${where}_$blocks" "${where}_none"; then
            ok "$where, $blocks: losses and model.bin bit-identical to none"
        else
            bad "$where, $blocks: losses or model.bin differ from none"
        fi
    done
done

echo "memory: device and host against the formulas"
for name in one_none one_kfso one_all-o pp2_1f1b_all-o; do
    held=$(field "$name" memory activation_bytes) formula=$(field "$name" memory activation_formula_bytes)
    held_ws=$(field "$name" memory workspace_bytes) formula_ws=$(field "$name" memory workspace_formula_bytes)
    if [[ -n $held && $held == "$formula" && $held_ws == "$formula_ws" ]]; then
        ok "$name: device activations $held B and workspace $held_ws B held, equal to the formula"
    else
        bad "$name: device activations $held B (formula $formula), workspace $held_ws B (formula $formula_ws)"
    fi
done
for name in one_kfso one_all-o pp2_1f1b_all-o; do
    held=$(field "$name" host_memory activation_bytes) formula=$(field "$name" host_memory activation_formula_bytes)
    if [[ -n $held && $held == "$formula" && $held -gt 0 ]]; then
        ok "$name: host activations $held B held, equal to the formula"
    else
        bad "$name: host activations $held B, formula $formula"
    fi
done
# offloading every block moves 4 records less their outputs to the host and adds two staging records on the
# device: less device memory in all (activations + workspace) than none
device() { echo $(( $(field "$1" memory activation_bytes) + $(field "$1" memory workspace_bytes) )); }
if [[ $(device one_all-o) -lt $(device one_none) ]]; then
    ok "device activations + workspace: none $(device one_none) B, every block offloaded $(device one_all-o) B"
else
    bad "device activations + workspace: none $(device one_none) B, every block offloaded $(device one_all-o) B: not less"
fi
if [[ -z $(field one_none host_memory activation_bytes) ]]; then
    ok "none: no host activations reported"
else
    bad "none: host activations reported"
fi

echo "refused with one line"
refused_flags=("${flags[@]}" --batch-size 8)
expect_refused "a letter that is not k, s, f or o" "'x' is not k (keep)" 1 --recompute-blocks kxso
expect_refused "three letters for records of 4 blocks" "3 letters for stage records of 4 blocks" 1 --recompute-blocks kso
expect_refused "4 letters for pp 2's records of 2 blocks" "4 letters for stage records of 2 blocks" 2 \
    --recompute-blocks kfso --pp 2 --pp-layers 2,2
expect_refused "letters and a policy" "--recompute-blocks and --recompute selective" 1 --recompute-blocks kfso \
    --recompute selective
expect_refused "an offloaded mixture of experts" "a mixture of experts cannot be offloaded" 1 --offload activations \
    --experts 4 --experts-per-token 2
finish
