#!/usr/bin/env bash
# What activation recomputation costs and saves: GPT-2 124M training steps at B=4, T=256 on the CPU (FP32
# build: its matmuls are what the CPU does fastest, and the memory figures are the same shape as BF16's
# times two) for every policy, one after the other on the same machine. Prints per policy: ms/step (mean
# of the steps after the first), the overhead against none, hardware FLOPs / model FLOPs (HFU / MFU), and
# the activations and workspace held at the peak beside llmc/planning/memory.h's formula.
#   usage: scripts/bench/bench_recompute.sh [STEPS] [BINARY]     (default 4 steps, ./train_gpt_fp32_cpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-4}
binary=${2:-./train_gpt_fp32_cpu}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
make --no-print-directory -s "${binary#./}" data >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "GPT-2 124M training steps, B=4 T=256, $binary, $OMP_NUM_THREADS threads, $(nproc) cores, $steps steps per policy"
printf "  %-22s %10s %9s %8s %14s %14s %14s %14s\n" policy ms/step overhead HFU/MFU activations "(formula)" workspace \
    "(formula)"
none_ms=""
for policy in none selective full:1 full:2 full:3 full:4 full:12; do
    name=${policy/:/_}
    every=1
    [[ $policy == *:* ]] && every=${policy##*:}
    "$binary" --model 124M --batch-size 4 --seq-len 256 --steps "$steps" --val-every 0 --sample-tokens 0 \
        --save-model false --recompute "${policy%%:*}" --recompute-every "$every" --output-dir "$work/$name" >/dev/null
    /usr/bin/python3 - "$work/$name/log.jsonl" "$policy" "${none_ms:-0}" >"$work/$name.row" <<'EOF'
import json, sys
path, policy, none_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
events = [json.loads(l) for l in open(path)]
steps = [e for e in events if e["event"] == "step"][1:]
memory = [e for e in events if e["event"] == "memory"][-1]
ms = sum(s["ms"] for s in steps) / len(steps)
ratio = steps[-1]["hardware_flops"] / steps[-1]["model_flops"]
overhead = f"{100 * (ms / none_ms - 1):+.1f}%" if none_ms > 0 else "-"
mib = lambda b: f"{b / 2**20:.1f} MiB"
label = policy.replace(":", ", every ")
print(f"{ms:.1f}")
print(f"  {label:22} {ms:10.1f} {overhead:>9} {ratio:8.3f} {mib(memory['activation_bytes']):>14} "
      f"{mib(memory['activation_formula_bytes']):>14} {mib(memory['workspace_bytes']):>14} "
      f"{mib(memory['workspace_formula_bytes']):>14}")
EOF
    [[ -z $none_ms ]] && none_ms=$(head -n 1 "$work/$name.row")
    tail -n 1 "$work/$name.row"
done
