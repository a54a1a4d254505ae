#!/usr/bin/env bash
# The README's main job: trains a small GPT-2 on the default corpus (Austen and the Bible) for a few minutes,
# on the GPU when there is one, else on the CPU. Prints the validation loss as it falls and a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    make --no-print-directory train_gpt
    # GPT-2 124M, 8 x 1024 tokens per micro-batch, 4 micro-batches per step
    exec ./train_gpt --model 124M --batch-size 8 --seq-len 1024 --total-batch-size 32768 --steps 300 \
        --learning-rate 6e-4 --warmup-steps 30 --val-every 50 --val-batches 5 --sample-every 100 \
        --sample-tokens 64 --output-dir out/default "$@"
else
    make --no-print-directory train_gpt_cpu
    # a 4-layer, 256-wide GPT-2 (16M parameters, most of them the embedding) on 8 x 64 tokens per step
    exec ./train_gpt_cpu --model custom --layers 4 --heads 4 --channels 256 --max-seq-len 64 --seq-len 64 \
        --batch-size 8 --steps 250 --learning-rate 2e-3 --warmup-steps 20 --val-every 50 --val-batches 8 \
        --sample-every 125 --sample-tokens 48 --output-dir out/default "$@"
fi
