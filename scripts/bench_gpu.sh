#!/usr/bin/env bash
# GPU benchmark: GPT-2 124M training steps at B=16, T=1024 (BF16): tokens/s and MFU (the FLOP formula and
# the peak table are in llmc/mfu.h). The first 3 steps are warm-up and not counted.
#   usage: scripts/bench_gpu.sh [STEPS]      (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
make --no-print-directory -s train_gpt data >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
./train_gpt --model 124M --batch-size 16 --seq-len 1024 --steps "$steps" --val-every 0 --sample-tokens 0 \
    --output-dir "$work" >/dev/null
grep '"event": "step"' "$work/log.jsonl" | tail -n +4 |
    sed -E 's/.*"ms": ([0-9.e+-]+), "tokens_per_s": ([0-9.e+-]+), "memory_mib": ([0-9.e+-]+), "mfu": ([0-9.e+-]+|null).*/\1 \2 \3 \4/' |
    awk '{ ms += $1; tps += $2; mem = $3; mfu += ($4 == "null" ? 0 : $4); n += 1 }
         END { printf "GPT-2 124M, B=16 T=1024, BF16: %.1f ms/step, %.0f tokens/s, MFU %.1f%%, %d MiB in use\n",
                      ms / n, tps / n, 100 * mfu / n, mem }'
