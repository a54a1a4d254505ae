#!/usr/bin/env bash
# Activation recomputation gives the same bits as none (llmc/parallel/recompute.h): for every policy (selective,
# full with a checkpoint every 1, 2 and 3 blocks of a 4-block model: segments of 1, 2, and 3 + 1 blocks),
# the training and validation losses and the final model.bin must be bit-identical to --recompute none,
# on one rank and on 2 ranks at ZeRO-3 (where the rerun gathers the parameters again), in FP32 and BF16,
# and at tp 2 with sequence parallelism (the rerun's collectives add the same numbers in the same order).
# Also: the activations and workspace held equal llmc/planning/memory.h's formula for each policy, less is kept
# the more is recomputed, and the hardware FLOPs exceed the model FLOPs by the rerun forward pass (full).
#   usage: scripts/test/test_recompute.sh ./train_gpt_fp32_cpu [./train_gpt_cpu]
set -u
binary=${1:?usage: $0 TRAIN_BINARY [BF16_TRAIN_BINARY]}
bf16_binary=${2:-}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 512 token ids (test_lib.sh's folded_data): recomputation in the blocks is this suite's
# subject, and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--model custom --layers 4 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --val-batches 2 --sample-tokens 0 --steps 3
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin" --total-batch-size 256)
policies="none selective full:1 full:2 full:3"
run() {  # run NAME BINARY RANKS POLICY[:EVERY] [FLAGS...]: B = 8 rows per data-parallel rank and micro-step
    local name=$1 program=$2 ranks=$3 policy=${4%%:*} every=1
    [[ $4 == *:* ]] && every=${4##*:}
    shift 4
    local tp=1
    [[ " $* " =~ " --tp "([0-9]+) ]] && tp=${BASH_REMATCH[1]}
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$program" "${flags[@]}" --batch-size $((8 * tp / ranks)) \
        --recompute "$policy" --recompute-every "$every" --output-dir "$work/$name" "$@" >"$work/$name.out" 2>&1 ||
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
}
same_bits() {  # same_bits A B: 3 training and 2 validation losses, and model.bin, bit for bit
    [[ $(logged_losses "$1" | wc -l) -eq 5 && "$(logged_losses "$1")" == "$(logged_losses "$2")" ]] && cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}
memory() {  # memory RUN FIELD: a number from the run's memory line
    PYTHONPATH="$(dirname "$0")" /usr/bin/python3 -c "from layout_check import events; print(events('$work', '$1', 'memory')[-1]['$2'])"
}

layouts=("one:1" "zero3:2:--zero,3" "tp2_sp:2:--tp,2,--sequence-parallel")
for precision in fp32 bf16; do
    program=$binary
    [[ $precision == bf16 ]] && program=$bf16_binary
    [[ -z $program ]] && continue
    echo "recomputation vs none, $precision ($program)"
    for layout in "${layouts[@]}"; do
        IFS=: read -r where ranks layout_flags <<<"$layout"
        [[ $precision == bf16 && $where == tp2_sp ]] && continue  # one BF16 composition is enough
        for policy in $policies; do
            run "${precision}_${where}_${policy/:/_}" "$program" "$ranks" "$policy" ${layout_flags//,/ }
        done
        for policy in $policies; do
            [[ $policy == none ]] && continue
            name="${precision}_${where}_${policy/:/_}"
            if same_bits "$name" "${precision}_${where}_none"; then
                ok "$where, --recompute ${policy/:/ --recompute-every }: losses and model.bin bit-identical to none"
            else
                bad "$where, --recompute ${policy/:/ --recompute-every }: losses or model.bin differ from none"
            fi
        done
    done
done

echo "memory and FLOPs per policy (one rank, FP32)"
previous=""
for policy in $policies; do
    name="fp32_one_${policy/:/_}"
    held=$(memory "$name" activation_bytes) formula=$(memory "$name" activation_formula_bytes)
    held_ws=$(memory "$name" workspace_bytes) formula_ws=$(memory "$name" workspace_formula_bytes)
    if /usr/bin/python3 -c "import sys; sys.exit(0 if $held == $formula and $held_ws == $formula_ws else 1)"; then
        ok "${policy/:/ every }: activations $held B and workspace $held_ws B held, equal to the formula"
    else
        bad "${policy/:/ every }: activations $held B (formula $formula), workspace $held_ws B (formula $formula_ws)"
    fi
done
kept() { memory "fp32_one_$1" activation_bytes; }
if /usr/bin/python3 -c "import sys; sys.exit(0 if $(kept none) > $(kept selective) > $(kept full_1) > $(kept full_2) else 1)"; then
    ok "activations kept: none $(kept none) > selective $(kept selective) > full $(kept full_1) > full every 2 $(kept full_2) B"
else
    bad "activations kept do not shrink with recomputation: none $(kept none), selective $(kept selective), full $(kept full_1), every 2 $(kept full_2)"
fi
# hardware FLOPs: full adds one forward pass of the blocks, 2 x 12 C^2 + 13 C parameters ... per token plus the
# attention's 4 C T; none and selective add none (llmc/parallel/recompute.h)
flops_check=$(PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" <<'EOF'
import sys
from layout_check import events
work = sys.argv[1]
L, C, T, tokens = 4, 32, 16, 256
extra = L * (2 * (12 * C * C + 13 * C) + 4 * C * T) * tokens
good = True
for name, expected in [("none", 0), ("selective", 0), ("full_1", extra), ("full_3", extra)]:
    s = events(work, f"fp32_one_{name}", "step")[-1]
    got = s["hardware_flops"] - s["model_flops"]
    good &= abs(got - expected) <= 1e-6 * s["model_flops"]  # the log keeps 9 significant digits
    print(f"{name}: hardware - model FLOPs {got:.0f}, expected {expected:.0f} (HFU/MFU {s['hardware_flops'] / s['model_flops']:.3f});", end=" ")
print("OK" if good else "BAD")
EOF
)
if [[ $flops_check == *OK ]]; then ok "hardware FLOPs: ${flops_check% OK}"; else bad "hardware FLOPs: $flops_check"; fi
# at ZeRO-3 the rerun forward passes gather parameters again when a segment is longer than the two block
# buffers hold: counted in the bytes sent
sent() { grep -o '"comm_bytes": [0-9]*' "$work/fp32_zero3_$1/log.jsonl" | tail -n 1 | cut -d' ' -f2; }
if [[ -n "$(sent none)" && $(sent full_3) -gt $(sent none) ]]; then
    ok "ZeRO-3 bytes per step: none $(sent none), full $(sent full_1), full every 2 $(sent full_2), every 3 $(sent full_3)"
else
    bad "ZeRO-3 bytes per step: none $(sent none), full every 3 $(sent full_3): the regathering is not counted"
fi
finish
