#!/usr/bin/env bash
# A batch ramp (--batch-ramp, llmc/batch_ramp.h) against one rank: 0:64,128:128,384:256 over 5 steps trains
# 64, 64, 128, 128, 256 tokens per step (16-token rows), so the phase changes twice within the run, and with it
# the micro-steps per step (gradient accumulation) and the pipeline's microbatches. The same ramp on dp 2 at
# ZeRO-1 and ZeRO-3, on pp 2 under gpipe (m = 2, 4, 8: the schedule played for each m, and gpipe's records grow
# with m, so the pools are sized for the largest) and on tp 2 x dp 2 must give the single rank's losses and final parameters within layout_check.py's 1e-5 (FP32: a layout only
# reorders float additions). A run resumed from the checkpoint of step 2 (128 tokens seen: its next step is the
# second phase's first) and of step 3 (256 seen, in the middle of the second phase) must continue bit for bit:
# the same logged losses, model.bin equal byte for byte. A resume whose ramp puts the step elsewhere, a phase the
# layout cannot split, bad syntax and thresholds that do not increase are refused with one line. --plan prints
# every phase. The dp 2 layouts measure the noise scale (--noise-scale) along the ramp: the same on each.
#   usage: scripts/test/test_batch_ramp.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

ramp=0:64,128:128,384:256
# the classics folded into 512 token ids (test_lib.sh's folded_data): the ramp's phases are this suite's subject,
# and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
model=(--layers 2 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule cosine --warmup-steps 2 --learning-rate 1e-3 --val-every 0 --sample-tokens 0
       --train-data "$work/data/train.bin")
flags=("${model[@]}" --batch-ramp "$ramp")                   # run_layout's (it adds --model custom, --steps 5)
refused_flags=("${model[@]}" --model custom --steps 1)       # expect_refused's (each gives its own ramp)

# name:ranks:B:flags; B x 16 tokens x data-parallel ranks is one micro-step
run_layout one 1 4 --checkpoint-every 1 --keep-checkpoints 10
# the dp 2 layouts measure the gradient noise scale too (llmc/noise_scale.h): each has the same small batch (a
# rank's first microbatch, 2 x 16 tokens), so their noise-scale logs must agree while the ramp moves the big one
run_layouts "dp2_zero1:2:2:--zero,1,--noise-scale
             dp2_zero3:2:2:--zero,3,--noise-scale
             pp2_gpipe:2:2:--pp,2,--pp-schedule,gpipe
             tp2_dp2:4:2:--tp,2,--noise-scale"
if [[ $(grep -o '"batch_tokens": [0-9]*' "$work/one/log.jsonl" | awk '{printf "%s ", $2}') == "64 64 128 128 256 " ]]; then
    ok "one rank: the step events' batch_tokens are 64 64 128 128 256"
else
    bad "one rank: batch_tokens $(grep -o '"batch_tokens": [0-9]*' "$work/one/log.jsonl" | tr '\n' ' ')"
fi
# every micro-step of a phase ran: the loss is the mean over the step's rows (dloss = 1 / (B T m)), so a step that
# ran fewer microbatches than its phase has logs a fraction of it, the same on every layout. At initialisation
# the loss is ln(512) = 6.24, and 5 steps at a learning rate of at most 1e-3 move it by less than 1% (measured
# 6.245 -> 6.186, 0.95% at most; at GPT-2's 50,257 ids 10.83 -> 10.77): every step's loss within 2% of the first's,
# where a step that ran half its microbatches would log half the loss
if /usr/bin/python3 -c "import sys; l = [float(x) for x in sys.argv[1:]]; sys.exit(0 if len(l) == 5 and max(abs(x - l[0]) for x in l) < 0.02 * l[0] else 1)" \
        $(logged_losses one | sed 's/.*"loss": //'); then
    ok "one rank: every step's loss within 2% of the first's (each phase ran all its microbatches)"
else
    bad "one rank: the losses $(logged_losses one | sed 's/.*"loss": //' | tr '\n' ' ')are not all within 2% of the first"
fi
if grep -q "| batch 256 |" "$work/one.out" && grep -q "pipeline: gpipe over 2 ranks .*8 record(s)" "$work/pp2_gpipe.out"; then
    ok "the console's step line shows the batch; gpipe's pools hold the largest phase's 8 records"
else
    bad "no '| batch 256 |' step line, or gpipe's pools not sized for m = 8"
fi

# resumed from step 2 (across a threshold) and step 3 (in the middle of a phase): bit for bit
for at in 2 3; do
    mkdir -p "$work/resumed_$at" && cp "$work"/one/checkpoint_${at}.* "$work/resumed_$at/"
    run_layout "resumed_$at" 1 4 --resume
    if [[ "$(logged_losses one | tail -n $((5 - at)))" == "$(logged_losses resumed_$at)" && $(logged_losses resumed_$at | wc -l) -eq $((5 - at)) ]] &&
        cmp -s "$work/one/model.bin" "$work/resumed_$at/model.bin"; then
        ok "resumed from step $at: steps $((at + 1))..5 logged the same losses, model.bin identical"
    else
        bad "resumed from step $at: losses or model.bin differ from the uninterrupted run"
    fi
done
mkdir -p "$work/moved" && cp "$work"/one/checkpoint_3.* "$work/moved/"
if ! "$binary" "${refused_flags[@]}" --batch-size 4 --batch-ramp 0:64 --resume --output-dir "$work/moved" \
        >"$work/moved.out" 2>&1 && [[ $(grep -c '^error:' "$work/moved.out") -eq 1 ]] &&
    grep -q "stands at 256 tokens seen after 3 steps" "$work/moved.out"; then
    ok "a resume whose ramp puts step 3 elsewhere: $(grep '^error:' "$work/moved.out")"
else
    bad "a resume with another ramp was not refused in one line: $(tail -2 "$work/moved.out")"
fi

expect_refused "a phase dp 2 cannot split" "--batch-ramp phase 128:96: 96 tokens per step are not a multiple" 2 \
    --batch-size 2 --batch-ramp 0:64,128:96
expect_refused "a phase zb-h1 at pp 2 cannot schedule" "--batch-ramp phase 0:32: zb-h1 needs at least" 2 \
    --batch-size 2 --pp 2 --pp-schedule zb-h1 --batch-ramp 0:32,64:64
expect_refused "bad syntax" "'0:64;128:128' is not TOKENS_SEEN:TOKENS_PER_STEP" 1 --batch-size 4 --batch-ramp "0:64;128:128"
expect_refused "thresholds not increasing" "thresholds must increase" 1 --batch-size 4 --batch-ramp 0:64,128:128,100:256
expect_refused "a ramp and --total-batch-size" "--batch-ramp and --total-batch-size" 1 --batch-size 4 --total-batch-size 64 \
    --batch-ramp 0:64

# --plan: one line per phase, gpipe's memory growing with its microbatches
"$binary" --model 124M --seq-len 1024 --batch-size 4 --pp 2 --pp-schedule gpipe --plan 8 \
    --batch-ramp 0:65536,1000000:131072,5000000:262144 >"$work/plan.out" 2>&1
memory=$(sed -n -E 's/.*microbatch\(es\) per step, .*memory ([0-9.]+) GiB.*/\1/p' "$work/plan.out" | tr '\n' ' ')
if grep -q "batch ramp: 3 phases" "$work/plan.out" && [[ $(grep -c "^  phase [0-2] from" "$work/plan.out") -eq 3 ]] &&
    grep -q "phase 2 from 5000000 tokens seen: 262144 tokens per step, 16 microbatch(es)" "$work/plan.out" &&
    /usr/bin/python3 -c "import sys; m = [float(x) for x in sys.argv[1:]]; sys.exit(0 if len(m) == 3 and m[0] < m[1] < m[2] else 1)" $memory; then
    ok "--plan: the three phases (4, 8, 16 microbatches), gpipe's memory growing: $memory GiB"
else
    bad "--plan: $(grep -A3 'batch ramp' "$work/plan.out")"
fi

echo "a batch ramp vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import compare_run, report, result
work = sys.argv[1]
results = []
for name in ["dp2_zero1", "dp2_zero3", "pp2_gpipe", "tp2_dp2"]:
    good, words = compare_run(work, name, "one", steps=5)
    results.append(report(good, f"{name:9} the ramp: {words}"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"
add_python_result "$work/compare.out"

# The noise scale under the ramp: every step's estimator saw that step's batch (big_tokens = batch_tokens: 64, 64,
# 128, 128, 256) and the rank's microbatch (32 tokens), and the three dp 2 layouts agree: the squared norms at the
# layout tolerance (1e-5 relative), what is derived from them at 1e-4 (a difference of two large terms while the
# noise dominates magnifies the norms' relative error; scripts/test/test_noise_scale.sh measured ~2e-5)
/usr/bin/python3 - "$work" >"$work/noise.out" <<'EOF' || true
import json, sys
work = sys.argv[1]
def events(name, kind):
    return [e for e in (json.loads(line) for line in open(f"{work}/{name}/log.jsonl")) if e["event"] == kind]
def error(a, b):  # relative; B_simple is null while the smoothed |G|^2 is not positive
    return 0.0 if a is None and b is None else abs(a - b) / abs(b) if None not in (a, b) else float("inf")
FIELDS = {"small_norm_sq": 1e-5, "big_norm_sq": 1e-5, "grad_sq": 1e-4, "trace_sigma": 1e-4, "b_simple": 1e-4}
reference = events("dp2_zero1", "noise_scale")
batches = [e["batch_tokens"] for e in events("dp2_zero1", "step")]
good = len(reference) == 5 and [e["big_tokens"] for e in reference] == batches and all(e["small_tokens"] == 32 for e in reference)
print(f"  {'ok  ' if good else 'FAIL'} dp2_zero1: the estimator saw each step's batch {[e['big_tokens'] for e in reference]}"
      f" (steps: {batches}) and a 32-token microbatch")
results = [good]
for name in ["dp2_zero3", "tp2_dp2"]:
    mine = events(name, "noise_scale")
    worst = {f: max((error(a[f], b[f]) for a, b in zip(mine, reference)), default=float("inf")) for f in FIELDS}
    good = len(mine) == len(reference) and all(worst[f] <= FIELDS[f] for f in FIELDS)
    print(f"  {'ok  ' if good else 'FAIL'} {name}: the noise scale under the ramp as dp2_zero1's, worst relative "
          + ", ".join(f"{f} {worst[f]:.1e}" for f in FIELDS))
    results.append(good)
print(f"RESULT {sum(results)} {len(results) - sum(results)}")
EOF
grep -v '^RESULT' "$work/noise.out"
add_python_result "$work/noise.out"
finish
