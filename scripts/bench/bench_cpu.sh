#!/usr/bin/env bash
# CPU benchmark: GPT-2 124M training steps (forward, backward, AdamW) at B=4, T=64, our CPU build against
# the PyTorch reference doing the same steps on the same machine, one after the other.
# Both get the same setting: 2 threads, passive waiting, and OpenBLAS told the core type on AVX-512 CPUs
# (OpenBLAS 0.3.21 does not recognise newer cores and falls back to a slow kernel).
#   usage: scripts/bench/bench_cpu.sh [STEPS]      (default 6; the first step of each is not counted)
# On a GPU machine: scripts/bench/bench_gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
make --no-print-directory -s train_gpt_fp32_cpu train_gpt_cpu data build/ref/124M_model.bin >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# mean milliseconds per step of a run's log, skipping the first (warm-up) step
mean_ms() {
    grep '"event": "step"' "$1/log.jsonl" | tail -n +2 | sed -E 's/.*"ms": ([0-9.e+-]+).*/\1/' |
        awk '{ total += $1; n += 1 } END { printf "%.1f", total / n }'
}
run_ours() {  # run_ours BINARY NAME
    "$1" --model build/ref/124M_model.bin --batch-size 4 --seq-len 64 --steps "$steps" --val-every 0 \
        --sample-tokens 0 --output-dir "$work/$2" >/dev/null
    mean_ms "$work/$2"
}

echo "GPT-2 124M training steps, B=4 T=64 (256 tokens), $OMP_NUM_THREADS threads, $(nproc) cores"
fp32_ms=$(run_ours ./train_gpt_fp32_cpu fp32)
bf16_ms=$(run_ours ./train_gpt_cpu bf16)
torch_line=$(/usr/bin/python3 dev/test/model_reference.py --model build/ref/124M_model.bin --batch-size 4 --seq-len 64 \
    --steps 0 --bench "$((steps - 1))" | grep '^pytorch:')
torch_ms=$(echo "$torch_line" | sed -E 's/pytorch: ([0-9.]+) ms.*/\1/')

report() {  # report NAME MS
    awk -v name="$1" -v ms="$2" -v torch="$torch_ms" 'BEGIN {
        printf "  %-28s %8.1f ms/step  %7.1f tokens/s  %5.2fx PyTorch\n", name, ms, 256000 / ms, torch / ms }'
}
report "train_gpt_fp32_cpu (FP32)" "$fp32_ms"
report "train_gpt_cpu (BF16)" "$bf16_ms"
report "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') (FP32)" "$torch_ms"
