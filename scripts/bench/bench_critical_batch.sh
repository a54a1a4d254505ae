#!/usr/bin/env bash
# The critical batch size of the default model on the default corpus, measured (McCandlish et al. 2018):
# trains it at five fixed batch sizes, a factor of 2 apart, to one validation loss, records the steps S and
# tokens E each took, fits (S/S_min - 1)(E/E_min - 1) = 1 and prints B_crit = E_min / S_min beside the gradient
# noise scale B_simple the runs measured (--noise-scale). Then it runs one --batch-ramp built from that noise
# scale against the best fixed batch. Prints the table and the fit, draws docs/batch/critical_batch.png and
# writes the table to docs/batch/critical_batch.md (scripts/critical_batch.py). Exits non-zero when a run never
# reaches the target, or the fit fails.
#   usage: scripts/bench/bench_critical_batch.sh [TARGET_LOSS] [OUTPUT_DIR]
#
# The runs. The model of make train (scripts/train_default.sh): on the CPU 4 layers x 256 channels, T = 64,
# on a GPU GPT-2 124M at T = 1024. --batch-size stays fixed, so the microbatches per step double with the
# batch. Each run stops at its first validation at or below the target (the rest is not needed): validation
# every val_tokens tokens of training (at least every step) on the same batches. The learning rate is
# constant after a short warmup, so a run's path to the target does not depend on how long it was asked to
# run. It grows with the square root of the batch (Adam's rule where the gradient noise dominates) up to
# make train's learning rate, lr_max, reached at lr_full_batch and kept above it (more batch stops allowing
# bigger steps past the noise scale). The paper tunes it per batch, which this budget does not allow.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
start=$(date +%s)
output=${2:-out/critical_batch}
python=/usr/bin/python3
if ! $python -c "import numpy, matplotlib" 2>/dev/null; then
    echo "bench_critical_batch.sh: needs python3-numpy and python3-matplotlib (apt-get install python3-numpy python3-matplotlib)"
    exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # not yet run on a GPU: the target and the learning rates are make train's, the budget a guess
    binary=./train_gpt
    model=(--model 124M --batch-size 8 --seq-len 1024)
    micro=8192 target=${1:-6.0} lr_max=6e-4 lr_full_batch=32768 val_tokens=65536 val_batches=4 max_tokens=20000000
else
    binary=./train_gpt_cpu
    model=(--model custom --layers 4 --heads 4 --channels 256 --max-seq-len 64 --seq-len 64 --batch-size 4)
    micro=256 target=${1:-7.0} lr_max=2e-3 lr_full_batch=2048 val_tokens=2048 val_batches=4 max_tokens=400000
fi
batches=($micro $((2 * micro)) $((4 * micro)) $((8 * micro)) $((16 * micro)))
make --no-print-directory -s "${binary#./}" data >/dev/null

# The noise scale's moving averages span about 1 / (1 - decay) steps: 5 here, as the runs take 8 to 40 steps
# to the target (the default 20 would average over most of a run, back to the start's loss).
help=$("$binary" --help 2>&1 || true)  # (grep -q on a pipe would end the binary early: pipefail)
noise=()
if grep -q -- "--noise-scale" <<<"$help"; then
    noise=(--noise-scale --noise-scale-decay 0.8)
else
    echo "MISSING: $binary has no --noise-scale: the runs measure no noise scale, and no ramp is built from it"
fi
has_ramp=0
if grep -q -- "--batch-ramp" <<<"$help"; then has_ramp=1; else
    echo "MISSING: $binary has no --batch-ramp: no ramped run"
fi

# train NAME LEARNING_RATE VAL_EVERY STEPS BATCH_FLAGS...: one run to the target in $output/NAME, at most STEPS
train() {
    local name=$1 lr=$2 val_every=$3 steps=$4
    shift 4
    local started=$SECONDS
    $python scripts/critical_batch.py until --log "$output/$name/log.jsonl" --target "$target" -- \
        "$binary" "${model[@]}" "$@" --steps "$steps" --learning-rate "$lr" --lr-schedule constant \
        --warmup-steps 4 --val-every "$val_every" --val-batches $val_batches --sample-tokens 0 --save-model false \
        --output-dir "$output/$name" >"$output/$name.out" 2>&1 || {
        grep -E "FAILED|error" "$output/$name.out" | tail -3
        echo "FAILED: the run $name did not reach validation loss $target (log in $output/$name.out)"
        exit 1
    }
    echo "  $name: reached $target in $((SECONDS - started)) s"
}

rm -rf "$output" docs/batch/critical_batch.md  # (an older run's table never passes for this one's)
mkdir -p "$output"
echo "critical batch: $binary, target validation loss $target, batches ${batches[*]} tokens per step," \
     "microbatch $micro tokens, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, $(getconf _NPROCESSORS_ONLN) cores"
fixed=()
for batch in "${batches[@]}"; do
    lr=$($python -c "print(f'{$lr_max * (min($batch, $lr_full_batch) / $lr_full_batch) ** 0.5:.3g}')")
    every=$(( val_tokens / batch > 1 ? val_tokens / batch : 1 ))
    # a step of one microbatch has no smaller batch to compare its gradient with: no noise scale there
    measure=()
    ((batch > micro)) && measure=("${noise[@]}")
    train "fixed_$batch" "$lr" "$every" $((max_tokens / batch)) --total-batch-size "$batch" "${measure[@]}"
    fixed+=("$output/fixed_$batch")
done

ramp_args=()
if ((has_ramp)) && ((${#noise[@]})); then
    plan=$($python scripts/critical_batch.py ramp --target "$target" --batches "$(IFS=,; echo "${batches[*]}")" \
        "${fixed[@]}") || { echo "FAILED: no ramp from the measured noise scale"; exit 1; }
    read -r ramp ramp_lr <<<"$plan"
    echo "  the ramp from the measured noise scale: --batch-ramp $ramp, at the best fixed batch's learning rate $ramp_lr"
    # validated every step: its steps are few once the batch has grown
    train ramp "$ramp_lr" 1 $((max_tokens / micro)) --batch-ramp "$ramp"
    ramp_args=(--ramp "$output/ramp")
fi

status=0
$python scripts/critical_batch.py report --target "$target" --fixed "${fixed[@]}" "${ramp_args[@]}" \
    --png docs/batch/critical_batch.png --markdown docs/batch/critical_batch.md || status=$?
runtime="bench_critical_batch.sh: $(( $(date +%s) - start )) s wall, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}, $(getconf _NPROCESSORS_ONLN) cores, $(date -u +%F)"
echo "$runtime"
[[ -f docs/batch/critical_batch.md ]] && echo "- $runtime" >>docs/batch/critical_batch.md
exit $status
