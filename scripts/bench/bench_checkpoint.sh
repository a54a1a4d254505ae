#!/usr/bin/env bash
# What a checkpoint costs the training loop, written synchronously and with --checkpoint-async: the same run on 2
# ranks at ZeRO-1 (each writes its shard; rank 0 the main file) three times, one after the other on the same
# machine: without checkpoints, with --checkpoint-every 1, and with --checkpoint-every 1 --checkpoint-async.
# A step's wall time here is the time between two step lines of log.jsonl ("time_s"), so it includes the save that
# follows the step (the logged "ms" does not). Prints, for each run, the median of those (the first step left out)
# and the median "save_ms" of its checkpoint events (how long the loop was held); the cost of a save is the step's
# wall time minus the run without checkpoints'. On this CPU build the background writer shares the cores with the
# ranks, so asynchronous saves hide only what the cores do not need (the waits for the disk); on a GPU the step
# runs on the device and the writer has a host core to itself.
#   usage: scripts/bench/bench_checkpoint.sh [STEPS] [BINARY] [MODEL FLAGS...]
#          (default 12 steps, ./train_gpt_fp32_cpu, GPT-2's vocabulary, 4 layers, 4 heads, 256 channels, B=4, T=64:
#           16.1M parameters, a 193 MB checkpoint)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-12}
binary=${2:-./train_gpt_fp32_cpu}
shift $(($# < 2 ? $# : 2))
model=("$@")
[[ ${#model[@]} -gt 0 ]] || model=(--model custom --layers 4 --heads 4 --channels 256 --max-seq-len 64
                                   --batch-size 4 --seq-len 64)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
make --no-print-directory -s "${binary#./}" data >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "2 ranks at ZeRO-1, ${model[*]}, $binary, $(nproc --all) cores, $steps steps each (the first one not counted)"
for mode in none sync async; do
    case $mode in
        none) save=() ;;
        sync) save=(--checkpoint-every 1) ;;
        async) save=(--checkpoint-every 1 --checkpoint-async) ;;
    esac
    mpirun --oversubscribe --allow-run-as-root -np 2 "$binary" "${model[@]}" --zero 1 --steps "$steps" \
        --lr-schedule constant --val-every 0 --sample-tokens 0 --save-model false "${save[@]}" \
        --output-dir "$work/$mode" >"$work/$mode.out" 2>&1 || { echo "error: the $mode run failed:"; tail -3 "$work/$mode.out"; exit 1; }
done
/usr/bin/python3 - "$work" <<'EOF'
import json, os, statistics, sys
work = sys.argv[1]
def run(name):
    events = [json.loads(line) for line in open(f"{work}/{name}/log.jsonl")]
    times = [e["time_s"] for e in events if e["event"] == "step"]
    walls = [1000 * (b - a) for a, b in zip(times, times[1:])]  # step k's wall time, k >= 2, with its save
    saves = [e["save_ms"] for e in events if e["event"] == "checkpoint"]
    return statistics.median(walls), statistics.median(saves) if saves else 0.0
none = run("none")[0]
size = sum(os.path.getsize(f"{work}/sync/{f}") for f in os.listdir(f"{work}/sync") if f.startswith("checkpoint_"))
size /= max(1, len({f.split(".")[0] for f in os.listdir(f"{work}/sync") if f.startswith("checkpoint_")}))
print(f"  checkpoint: {size / 1e6:.0f} MB in its files")
print(f"  {'':40} {'step wall ms':>12} {'save_ms':>9} {'cost of a save':>15}")
print(f"  {'no checkpoints':40} {none:12.1f} {'-':>9} {'-':>15}")
for name, label in (("sync", "--checkpoint-every 1"), ("async", "--checkpoint-every 1 --checkpoint-async")):
    wall, held = run(name)
    print(f"  {label:40} {wall:12.1f} {held:9.1f} {wall - none:12.1f} ms")
EOF
