#!/usr/bin/env bash
# The pipeline's bubble, measured beside its formula: the README's model (32 layers x 512 channels, T = 32) at
# p = 4 pipeline ranks and m = 8 microbatches on the CPU build (FP32), stages balanced by cost (--pp-layers
# auto), under each schedule: gpipe, 1f1b, interleaved (V = 2) and zb-h1. Each run trains 2 steps; the
# last is measured: every rank notes the start and end of each action and of each wait for a message, and the
# bubble of a rank is the share of the step it did not work (llmc/parallel/pipeline.h). Prints, per schedule,
# the mean bubble over the ranks, each rank's, the schedule's formula (llmc/parallel/pipeline_schedule.h's
# pipeline_bubble_fraction, equal stages), the step time and zb-h1's bubble as a share of 1f1b's; writes each
# step's timeline picture to OUT (default docs/pipeline).
#   usage: scripts/bench/bench_pipeline_bubble.sh [OUT]     (4 ranks: the timing is only meaningful on a quiet
#          machine; with fewer cores than ranks the ranks share them)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/pipeline}
binary=./train_gpt_fp32_cpu
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
make --no-print-directory -s "${binary#./}" data >/dev/null
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--model custom --layers 32 --channels 512 --heads 8 --seq-len 32 --batch-size 1 --total-batch-size 256
       --steps 2 --val-every 0 --sample-tokens 0 --save-model false --pp 4)
echo "32 layers x 512 channels, T 32, p 4, m 8, $binary, $(nproc --all) cores"
for schedule in gpipe 1f1b interleaved zb-h1; do
    extra=()
    [[ $schedule == interleaved ]] && extra=(--pp-virtual 2)
    mpirun --oversubscribe --allow-run-as-root -np 4 "$binary" "${model[@]}" --pp-schedule "$schedule" "${extra[@]}" \
        --trace "$work/$schedule.json" --output-dir "$work/$schedule" >"$work/$schedule.out" 2>&1 ||
        { echo "the $schedule run failed:"; tail -3 "$work/$schedule.out"; exit 1; }
    /usr/bin/python3 scripts/pipeline_timeline.py "$work/$schedule.json" -o "$out/measured_${schedule}_p4_m8.png" >/dev/null
done
/usr/bin/python3 - "$work" <<'PYTHON'
import json, sys
work = sys.argv[1]
rows = {}
for schedule in ["gpipe", "1f1b", "interleaved", "zb-h1"]:
    events = [json.loads(line) for line in open(f"{work}/{schedule}/log.jsonl")]
    pipeline = [e for e in events if e["event"] == "pipeline"][-1]
    bubbles = pipeline["bubble"]
    rows[schedule] = sum(bubbles) / len(bubbles)
    print(f"  {schedule:12} bubble {rows[schedule]:.3f} (ranks {' '.join(f'{b:.3f}' for b in bubbles)}), formula "
          f"{pipeline['bubble_formula']:.3f}; step {pipeline['step_ms']:.0f} ms; layers per stage "
          f"{pipeline['stage_layers']}")
print(f"  zb-h1's bubble / 1f1b's = {rows['zb-h1'] / rows['1f1b']:.2f}; 1f1b's / its formula 3/11 = "
      f"{rows['1f1b'] / (3 / 11):.2f}")
PYTHON
