#!/usr/bin/env bash
# --recompute auto (llmc/planning/recompute_choice.h) in runs of a tiny model (4 layers, C 32, T 32, B 8, FP32, 3
# steps). --memory-reserve 0: the CPU build's runs hold nothing beyond what tracked_alloc books (no CUDA context,
# cuBLASLt or NCCL), so the whole --gpu-memory is the plan's. The budgets come from the program's own numbers: the
# plan's total with every block kept and the least memory possible (the error line's), in bytes:
#   keep   the total with every block kept + 64 KiB      the letters are kkkk
#   mix    halfway between the least and keep            two kinds or more
#   tight  the least + 16 KiB                            no block kept whole
#   below  the least - 64 KiB                            one error line naming the budget and the least, exit != 0
# For keep, mix and tight: --plan prints the same letters as the run; the run holds at most the budget at its peak,
# its activations and workspace equal the formula to the byte (the memory event, as test_recompute.sh reads it),
# and its losses and model.bin are bit-identical to --recompute none. Then a layout of the matrix, dp 2 x pp 2
# (gpipe, 2 + 2 layers, 2 microbatches: 2 records in flight) x tp 2 under auto at the mix budget of that layout,
# against one rank on the same global batch of 512 tokens (scripts/test/layout_check.py). (With one block per stage record nothing saves memory: full's and
# selective's shared buffers are as large as what they drop; the layout has two.)
#   usage: scripts/test/test_recompute_auto.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# the classics folded into 512 token ids (test_lib.sh's folded_data): the blocks' records are this suite's subject,
# and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--model custom --layers 4 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 32
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --val-batches 2 --sample-tokens 0 --steps 3
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin" --total-batch-size 256
       --memory-reserve 0)
gib() { /usr/bin/python3 -c "print('%.9f' % ($1 / 2**30))"; }
train() {  # train NAME RANKS B FLAGS...: into $work/NAME, output in $work/NAME.out; the exit status
    local name=$1 ranks=$2 batch=$3
    shift 3
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" --batch-size "$batch" \
        --output-dir "$work/$name" "$@" >"$work/$name.out" 2>&1
}
letters() { grep -o -- '--recompute-blocks [ksfo]*$' "$1" | head -1 | cut -d' ' -f2; }
memory() {  # memory RUN FIELD: a number from the run's memory event
    PYTHONPATH="$(dirname "$0")" /usr/bin/python3 -c "from layout_check import events; print(events('$work', '$1', 'memory')[-1]['$2'])"
}
same_bits() {  # same_bits A B: 3 training and 2 validation losses, and model.bin, bit for bit
    [[ $(logged_losses "$1" | wc -l) -eq 5 && "$(logged_losses "$1")" == "$(logged_losses "$2")" ]] &&
        cmp -s "$work/$1/model.bin" "$work/$2/model.bin"
}

# probe LAYOUT RANKS B FLAGS...: sets keep_bytes and least_bytes for a layout (runs that stop before training, or
# train 3 steps where every block is kept)
probe() {
    local name=$1 ranks=$2 batch=$3
    shift 3
    train "${name}_probe_least" "$ranks" "$batch" "$@" --recompute auto --gpu-memory 0.0001
    least_bytes=$(grep -o 'least memory possible is [^(]*([0-9]* B' "$work/${name}_probe_least.out" | head -1 | grep -o '[0-9]* B$' | tr -dc 0-9)
    train "${name}_probe_keep" "$ranks" "$batch" "$@" --recompute auto --gpu-memory 1000
    keep_bytes=$(grep -o 'the fullest pp rank [^(]*([0-9]* B)' "$work/${name}_probe_keep.out" | head -1 | grep -o '([0-9]* B)' | tr -dc 0-9)
    if [[ -z $least_bytes || -z $keep_bytes ]]; then
        bad "$name: no least or keep memory in the probes: $(grep -m1 error: "$work/${name}_probe_least.out")"
        return 1
    fi
    echo "  $name: every block kept $keep_bytes B, the least possible $least_bytes B"
}

echo "--recompute auto on one rank: three budgets and one below the least ($binary)"
train none 1 8 --recompute none || bad "none: the run failed: $(grep -m1 error: "$work/none.out")"
if probe one 1 8; then
    budget_keep=$((keep_bytes + 65536)) budget_tight=$((least_bytes + 16384)) budget_below=$((least_bytes - 65536))
    budget_mix=$(((keep_bytes + least_bytes) / 2))
    for which in keep mix tight; do
        budget_var=budget_$which
        budget=${!budget_var}
        train "auto_$which" 1 8 --recompute auto --gpu-memory "$(gib "$budget")"
        status=$?
        chosen=$(letters "$work/auto_$which.out")
        ./"$binary" "${flags[@]}" --batch-size 8 --recompute auto --gpu-memory "$(gib "$budget")" --plan 1 \
            >"$work/plan_$which.out" 2>&1
        planned=$(letters "$work/plan_$which.out")
        case $which in
            keep) shape_ok=$([[ $chosen == kkkk ]] && echo yes) ;;
            mix) shape_ok=$([[ $(echo "$chosen" | fold -w1 | sort -u | wc -l) -ge 2 ]] && echo yes) ;;
            tight) shape_ok=$([[ -n $chosen && $chosen != *k* ]] && echo yes) ;;
        esac
        if [[ -n $shape_ok ]]; then ok "$which: budget $budget B, letters $chosen"; else bad "$which: budget $budget B, letters '$chosen'"; fi
        if [[ -n $chosen && $planned == "$chosen" ]]; then
            ok "$which: --plan prints the run's letters $planned"
        else
            bad "$which: --plan prints '$planned', the run chose '$chosen'"
        fi
        if [[ $status -ne 0 ]]; then bad "$which: the run failed: $(grep -m1 error: "$work/auto_$which.out")"; continue; fi
        peak=$(memory "auto_$which" peak_bytes)
        if [[ $peak -le $budget ]]; then ok "$which: peak $peak B held <= budget $budget B"; else bad "$which: peak $peak B > budget $budget B"; fi
        held=$(memory "auto_$which" activation_bytes) formula=$(memory "auto_$which" activation_formula_bytes)
        held_ws=$(memory "auto_$which" workspace_bytes) formula_ws=$(memory "auto_$which" workspace_formula_bytes)
        if /usr/bin/python3 -c "import sys; sys.exit(0 if $held == $formula and $held_ws == $formula_ws else 1)"; then
            ok "$which: activations $held B and workspace $held_ws B held, equal to the formula"
        else
            bad "$which: activations $held B (formula $formula), workspace $held_ws B (formula $formula_ws)"
        fi
        if same_bits "auto_$which" none; then
            ok "$which: losses and model.bin bit-identical to --recompute none"
        else
            bad "$which: losses or model.bin differ from --recompute none"
        fi
    done
    refused_flags=("${flags[@]}" --batch-size 8)
    expect_refused "below the least ($budget_below B)" "no choice of k, s, f, o per block fits" 1 \
        --recompute auto --gpu-memory "$(gib "$budget_below")"
fi

echo "the matrix's auto layout: dp 2 x pp 2 (gpipe, 2 microbatches) x tp 2 vs one rank"
# the global batch of 512 tokens: one rank B 8 in 2 micro-steps, the layout B 4 per dp rank in 2 microbatches, so that
# both validate on the same 16 rows
for i in "${!flags[@]}"; do [[ ${flags[$i]} == --total-batch-size ]] && flags[$((i + 1))]=512; done
train matrix_one 1 8 --recompute none || bad "matrix_one: the run failed: $(grep -m1 error: "$work/matrix_one.out")"
matrix=(--pp 2 --tp 2 --pp-schedule gpipe --pp-layers 2,2)
if probe matrix 8 4 "${matrix[@]}"; then
    train matrix_auto 8 4 "${matrix[@]}" --recompute auto \
        --gpu-memory "$(gib $(((keep_bytes + least_bytes) / 2)))"
    echo "  letters $(letters "$work/matrix_auto.out")"
    PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import compare_run, memory_against_formula, report, result
work = sys.argv[1]
try:
    same_run, run_words = compare_run(work, "matrix_auto", "matrix_one", steps=3, validations=2)
    same_memory, memory_words, _ = memory_against_formula(work, "matrix_auto")
    results = [report(same_run and same_memory, f"dp 2 x pp 2 x tp 2, auto: {run_words}; {memory_words}")]
except Exception as error:  # a run that failed left no log or no model
    results = [report(False, f"dp 2 x pp 2 x tp 2, auto: no result ({error})")]
result(results)
EOF
    grep -v '^RESULT' "$work/compare.out"
    add_python_result "$work/compare.out"
fi
finish
