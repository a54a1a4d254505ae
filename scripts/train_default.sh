#!/usr/bin/env bash
# The README's main job: trains a small GPT-2 on the default corpus (Austen and the Bible) for a few minutes,
# on the GPU when there is one, else on the CPU. Prints the validation loss as it falls and a sample, and
# draws the losses into out/default/loss.png (scripts/loss_curves.py) when matplotlib is there.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi

output_dir=out/default

# Runs the trainer, then draws its losses (also after a failed run: its log up to the failure is worth a
# look), and returns the trainer's exit status, so that a failed training still fails make train. A
# missing matplotlib or a failed plot costs only the picture. A log this run did not write (it stopped
# before opening it) is an older run's: not drawn, so the picture never passes for this run's.
train_and_plot() {
    local status=0 log="$output_dir/log.jsonl"
    local log_before
    log_before=$(stat -c %y "$log" 2>/dev/null || true)
    "$@" || status=$?
    if [[ ! -s "$log" || "$(stat -c %y "$log" 2>/dev/null)" == "$log_before" ]]; then
        echo "no $output_dir/loss.png: the run wrote no log"
    elif ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
        echo "no $output_dir/loss.png: python3-matplotlib is not installed (apt-get install python3-matplotlib)"
    elif ! /usr/bin/python3 scripts/loss_curves.py "$log" -o "$output_dir/loss.png" --title "make train"; then
        echo "no $output_dir/loss.png: scripts/loss_curves.py failed"
    fi
    return "$status"
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    make --no-print-directory train_gpt
    # GPT-2 124M, 8 x 1024 tokens per micro-batch, 4 micro-batches per step
    train_and_plot ./train_gpt --model 124M --batch-size 8 --seq-len 1024 --total-batch-size 32768 --steps 300 \
        --learning-rate 6e-4 --warmup-steps 30 --val-every 50 --val-batches 5 --sample-every 100 \
        --sample-tokens 64 --output-dir "$output_dir" "$@"
else
    make --no-print-directory train_gpt_cpu
    # a 4-layer, 256-wide GPT-2 (16M parameters, most of them the embedding) on 8 x 64 tokens per step
    train_and_plot ./train_gpt_cpu --model custom --layers 4 --heads 4 --channels 256 --max-seq-len 64 --seq-len 64 \
        --batch-size 8 --steps 250 --learning-rate 2e-3 --warmup-steps 20 --val-every 50 --val-batches 8 \
        --sample-every 125 --sample-tokens 48 --output-dir "$output_dir" "$@"
fi
