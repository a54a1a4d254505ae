#!/usr/bin/env bash
# The pipeline's bubble, measured beside its formula: the README's model (32 layers x 512 channels, T = 32) with
# m = 8 microbatches on the CPU build (FP32), stages balanced by cost (--pp-layers auto), under each schedule:
# gpipe, 1f1b, interleaved (V = 2), zb-h1 and zbv, at p = 2 and at p = 4. Each run trains 2 steps; the last is
# measured: every rank notes the start and end of each action and of each wait for a message, and the processor
# time each action took (llmc/parallel/pipeline_timeline.h). The bubble of a rank is the share of the step it did not
# work, three ways:
#   measured   on the wall clock. It holds where each rank has a core (p = 2 on 2 cores); with fewer cores than
#              ranks the ranks take turns on the cores, and the wall clock measures the turns as much as the
#              schedule.
#   replayed   each action takes the processor time it took, and starts when its rank is free and its input
#              has come (pipeline_replay): the step as the ranks would run it each on a core of its own, with
#              free sends, and with the executor's synchronous groups (an action also waits until its group's
#              peers have posted). Where each rank has a core the synchronous replay and the wall clock must
#              agree, which the p = 2 table shows.
#   planned    what the planner predicts from the passes as they were: each stage's mean F, B and W over the step
#              (processor time), fed to the simulation the planner's bubble comes from (pipeline_simulator.h's
#              pipeline_simulate_stages: the schedule's lists and the executor's synchronous groups, every action
#              of a stage as long as that stage's mean of its kind, the messages free; logged as bubble_planned by
#              llmc/parallel/pipeline_timeline.h).
# The check of the planner: at p = 2 the planned bubbles of 1f1b, zb-h1 and zbv against the measured ones (the
# mean over the ranks of each), each within 15% of it (a PASS or FAIL line; the script exits 1 on a FAIL). The
# wall clock is what the planner's bubble claims to predict (the share of a step a rank idles), and at p = 2 each
# rank has a core, so the wall clock measures the schedule and the messages alone. At p = 4 the wall clock
# counts the ranks' turns on the 2 cores, which the planner does not model as bubble: there the planned bubble is
# printed beside the replayed one, which runs each action for the time it took (no verdict: the two differ only
# by the spread of each stage's passes around their mean and by the replay's real order of work).
# Prints, per p and schedule, the formula (pipeline_bubble_fraction: equal stages, F = B = W), the mean bubble
# over the ranks each way, each rank's replayed, the step time each way, 1f1b's bubble against its formula,
# zb-h1's and zbv's against 1f1b's, and zb-h1's formula with rank 0's measured F, B and W (the passes as they
# are, not F = B = W) with W's share of F + B + W beside the share that formula needs to reach half of 1f1b's;
# writes each measured step's timeline picture to OUT (default docs/pipeline,
# measured_<schedule>_p<p>_m8.png).
#   usage: scripts/bench/bench_pipeline_bubble.sh [OUT]     (a quiet machine: other work inflates both clocks)
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
       --steps 2 --val-every 0 --sample-tokens 0 --save-model false)
echo "32 layers x 512 channels, T 32, m 8, $binary, $(nproc --all) cores"
schedules=(gpipe 1f1b interleaved zb-h1 zbv)
for p in 2 4; do
    for schedule in "${schedules[@]}"; do
        extra=()
        [[ $schedule == interleaved ]] && extra=(--pp-virtual 2)
        mpirun --oversubscribe --allow-run-as-root -np $p "$binary" "${model[@]}" --pp $p --pp-schedule "$schedule" \
            "${extra[@]}" --trace "$work/$schedule.p$p.json" --output-dir "$work/$schedule.p$p" \
            >"$work/$schedule.p$p.out" 2>&1 ||
            { echo "the $schedule run at p $p failed:"; tail -3 "$work/$schedule.p$p.out"; exit 1; }
        /usr/bin/python3 scripts/pipeline_timeline.py "$work/$schedule.p$p.json" \
            -o "$out/measured_${schedule}_p${p}_m8.png" >/dev/null
    done
done
/usr/bin/python3 - "$work" "${schedules[@]}" <<'PYTHON'
import json, sys
work, schedules = sys.argv[1], sys.argv[2:]
def pipeline(name):
    events = [json.loads(line) for line in open(f"{work}/{name}/log.jsonl")]
    return [e for e in events if e["event"] == "pipeline"][-1]
mean = lambda values: sum(values) / len(values)
failures = 0
for p in (2, 4):
    print(f"p {p}, m 8{' (a core per rank: measured and replayed agree)' if p == 2 else ' (2 ranks per core here)'}")
    print(f"  {'schedule':12} {'formula':>8} {'replayed':>9} {'synchronous':>12} {'measured':>9} {'planned':>8}  "
          f"{'replayed per rank':24} step replayed, synchronous, measured, planned")
    replayed, measured, planned = {}, {}, {}
    for schedule in schedules:
        run = pipeline(f"{schedule}.p{p}")
        replayed[schedule] = mean(run["bubble_replayed"])
        measured[schedule], planned[schedule] = mean(run["bubble"]), mean(run["bubble_planned"])
        per_rank = " ".join(f"{b:.3f}" for b in run["bubble_replayed"])
        print(f"  {schedule:12} {run['bubble_formula']:8.3f} {replayed[schedule]:9.3f} "
              f"{mean(run['bubble_replayed_synchronous']):12.3f} {measured[schedule]:9.3f} {planned[schedule]:8.3f}  "
              f"{per_rank:24} {run['step_ms_replayed']:5.0f}, {run['step_ms_replayed_synchronous']:5.0f}, "
              f"{run['step_ms']:5.0f}, {run['step_ms_planned']:5.0f} ms  (layers per stage {run['stage_layers']})")
    for schedule in ("1f1b", "zb-h1", "zbv"):
        passes = "; ".join(f"stage {s}: F {f:.1f}, B {b:.1f}" + (f", W {w:.1f}" if w > 0 else "")
                           for s, (f, b, w) in enumerate(pipeline(f"{schedule}.p{p}")["stage_pass_ms"]))
        against = measured if p == 2 else replayed
        ratio = planned[schedule] / against[schedule] if against[schedule] > 0 else float("inf")
        verdict = ("PASS" if abs(ratio - 1) <= 0.15 else "FAIL") if p == 2 else "    "
        failures += verdict == "FAIL"
        print(f"  {verdict} {schedule:6} planned {planned[schedule]:.3f} / {'measured' if p == 2 else 'replayed'} "
              f"{against[schedule]:.3f} = {ratio:.2f}{' (within 15%)' if p == 2 else ''}; mean passes, ms: {passes}")
    formula = (p - 1) / (8 + p - 1)
    print(f"  replayed: 1f1b's bubble / its formula {formula:.3f} = {replayed['1f1b'] / formula:.2f}; zb-h1's / "
          f"1f1b's = {replayed['zb-h1'] / replayed['1f1b']:.2f}; zbv's / 1f1b's = "
          f"{replayed['zbv'] / replayed['1f1b']:.2f}")
    # zb-h1's formula with the passes as they are: rank 0's mean processor time per F, B and W (the trace's work_ms)
    trace = json.load(open(f"{work}/zb-h1.p{p}.json"))["traceEvents"]
    passes = {kind: mean([e["args"]["work_ms"] for e in trace if e.get("cat") == "work" and e["tid"] == 0
                          and e["name"][0] == kind]) for kind in "FBW"}
    F, B, W = passes["F"], passes["B"], passes["W"]
    zb = (p - 1) * (F + B - W) / (8 * (F + B + W) + (p - 1) * (F + B - W))
    print(f"  zb-h1's formula with rank 0's passes (F {F:.0f}, B {B:.0f}, W {W:.0f} ms): (p-1)(F+B-W) / "
          f"(m(F+B+W) + (p-1)(F+B-W)) = {zb:.3f}, {zb / formula:.2f} of 1f1b's formula")
    # 1f1b's bubble is (p-1)/(m+p-1) whatever F, B and W are. zb-h1's is at most half of it where
    # (F+B-W)(2m+p-1) <= m(F+B+W), that is where W / (F+B+W) >= (m+p-1) / (2(2m+p-1)).
    needed = (8 + p - 1) / (2 * (2 * 8 + p - 1))
    print(f"  W's share of F+B+W on rank 0: {W / (F + B + W):.3f}; zb-h1's formula reaches half of 1f1b's from "
          f"{needed:.3f} on")
sys.exit(1 if failures else 0)
PYTHON
