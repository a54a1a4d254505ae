#!/usr/bin/env bash
# What --check-replicas costs: GPT-2 124M on 2 data-parallel ranks (BF16 CPU build, B=1, T=64), the same
# steps with the check at every step and without it, one run after the other on the same machine. Prints
# the median ms/step of each and the difference, the cost of one check (a checksum of the 124M parameters
# on the host and one all-gather of 8 bytes per tensor), and that cost as a share of a step at
# --check-replicas 1 and 100.
#   usage: scripts/bench/bench_replica_check.sh [STEPS] [BINARY]     (default 8 steps, ./train_gpt_cpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-8}
binary=${2:-./train_gpt_cpu}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
make --no-print-directory -s "${binary#./}" data >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "GPT-2 124M, 2 ranks x B=1 x T=64, $binary, $(nproc --all) cores, $steps steps each (the first one not counted)"
for every in 0 1; do
    mpirun --oversubscribe --allow-run-as-root -np 2 "$binary" --model 124M --batch-size 1 --seq-len 64 \
        --steps "$steps" --val-every 0 --sample-tokens 0 --save-model false --check-replicas "$every" \
        --output-dir "$work/check_$every" >/dev/null
done
/usr/bin/python3 - "$work" <<'EOF'
import json, statistics, sys
def median_ms(name):
    times = [e["ms"] for e in map(json.loads, open(f"{sys.argv[1]}/{name}/log.jsonl")) if e.get("event") == "step"]
    return statistics.median(times[1:])
without, checked = median_ms("check_0"), median_ms("check_1")
cost = checked - without
print(f"  without the check      {without:9.1f} ms/step")
print(f"  --check-replicas 1     {checked:9.1f} ms/step   one check: {cost:.1f} ms")
print(f"  share of a step        {cost / without:.2%} at --check-replicas 1, {cost / without / 100:.3%} at 100")
EOF
