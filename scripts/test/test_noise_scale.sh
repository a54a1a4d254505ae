#!/usr/bin/env bash
# The gradient noise scale (--noise-scale, llmc/noise_scale.h), CPU build, FP32:
#  (a) the estimator against a brute-force variance over 64 microbatch gradients at a fixed checkpoint (a model
#      trained 5 steps, then run at --learning-rate 0, which leaves every parameter as it was: checked). The
#      estimator runs on 4 data-parallel ranks of one microbatch each for 16 steps, so its small batches are the
#      64 microbatches; the brute force runs the same 64 rows, in the same order (shuffled rows: the data loader
#      orders rows alike for any number of ranks), one at a time (64 steps of one microbatch: |g_k|^2, the
#      logged grad_norm squared) and all at once (one step of 64 microbatches: |gbar|^2). With
#          sum_k |g_k - gbar|^2 = sum_k |g_k|^2 - K |gbar|^2,
#      tr(Sigma_B) = that / (K - 1) (the unbiased covariance trace of a microbatch gradient), |G|^2 = |gbar|^2 -
#      tr(Sigma_B) / K, and B_simple = B_small tr(Sigma_B) / |G|^2. Each step's small-batch norm must also equal
#      the mean of its 4 microbatches' |g_k|^2 (1e-5: the same sums in another order).
#  (b) the noise-scale log equal across layouts whose small batch is the same microbatch (a Llama block): one rank
#      against pp 2 (1f1b), tp 2, and tp 2 with sequence parallelism at ZeRO-2 (which sums the layernorms' partial
#      gradients after every microbatch), the same B and microbatches; dp 2 at ZeRO-1 against dp 2 at ZeRO-3 and tp 2
#      x dp 2 (the same B per rank). (One rank and dp 2 differ by construction: a rank's
#      small batch is one microbatch of its own rows, a different batch.)
#  (c) a run resumed from a checkpoint logs the noise scale of the uninterrupted run, bit for bit.
#  (d) what cannot give a rank a microbatch's whole gradient is refused with one line naming --noise-scale.
#   usage: scripts/test/test_noise_scale.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
# the classics folded into 512 token ids (test_lib.sh's folded_data): the gradient's statistics are this suite's
# subject, and GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
data=(--train-data "$work/data/train.bin" --val-data "$work/data/val.bin")
quiet=(--val-every 0 --sample-tokens 0 --lr-schedule constant)
mpi() { mpirun --oversubscribe --allow-run-as-root "$@"; }

echo "(a) the estimator against a brute-force variance, at a fixed checkpoint"
tiny=(--layers 1 --heads 2 --channels 32 --vocab-size 512 --max-seq-len 16 --seq-len 16 --batch-size 1
      "${quiet[@]}" "${data[@]}")
"$binary" "${tiny[@]}" --model custom --learning-rate 1e-3 --steps 5 --output-dir "$work/trained" >"$work/trained.out" 2>&1 ||
    bad "training the checkpoint failed: $(grep -m1 error: "$work/trained.out")"
fixed=("${tiny[@]}" --model "$work/trained/model.bin" --learning-rate 0)
mpi -np 4 "$binary" "${fixed[@]}" --steps 16 --noise-scale 1 --noise-scale-decay 0.9999 --output-dir "$work/estimator" \
    >"$work/estimator.out" 2>&1 || bad "the estimator's run failed: $(grep -m1 error: "$work/estimator.out")"
"$binary" "${fixed[@]}" --steps 64 --save-model false --output-dir "$work/each" >"$work/each.out" 2>&1 ||
    bad "the microbatches' run failed: $(grep -m1 error: "$work/each.out")"
"$binary" "${fixed[@]}" --steps 1 --total-batch-size 1024 --save-model false --output-dir "$work/all" \
    >"$work/all.out" 2>&1 || bad "the mean's run failed: $(grep -m1 error: "$work/all.out")"
if cmp -s "$work/trained/model.bin" "$work/estimator/model.bin"; then
    ok "16 steps at learning rate 0 leave the parameters as they were (model.bin identical)"
else
    bad "the parameters moved at learning rate 0"
fi
/usr/bin/python3 - "$work" >"$work/estimator.check" <<'EOF'
import json, math, statistics, sys
work = sys.argv[1]
def events(name, kind):
    return [e for e in (json.loads(line) for line in open(f"{work}/{name}/log.jsonl")) if e["event"] == kind]
results = []
def check(good, words):
    print(("  ok   " if good else "  FAIL ") + words)
    results.append(good)
B_small, ranks = 16, 4
each = [e["grad_norm"] ** 2 for e in events("each", "step")]           # |g_k|^2, k = 0..63
mean = events("all", "step")[0]["grad_norm"] ** 2                      # |gbar|^2
noise = events("estimator", "noise_scale")
K = len(each)
if K != 64 or len(noise) != 16:
    check(False, f"{K} microbatch norms and {len(noise)} noise-scale events (64 and 16 expected)")
    print(f"RESULT {sum(results)} {len(results) - sum(results)}"); sys.exit()
# the measurement: step s's small batch is rank r's microbatch 4s + r, its squared norm averaged over the ranks
worst = max(abs(n["small_norm_sq"] - statistics.fmean(each[4 * s:4 * s + 4])) / n["small_norm_sq"]
            for s, n in enumerate(noise))
check(worst <= 1e-5, f"each step's small-batch |G_small|^2 is the mean of its 4 microbatches' |g_k|^2 "
      f"(worst {worst:.1e}, tol 1e-5)")
trace_B = (sum(each) - K * mean) / (K - 1)
grad_squared = mean - trace_B / K
brute = B_small * trace_B / grad_squared
estimate = noise[-1]["b_simple"]
# The estimator's own sampling error (the delta method on the ratio of the 16 steps' mean estimates): its |G|^2
# comes from the 6 pairs of microbatches within each step (g_i . g_j), the brute force's from all 2016 pairs, and
# in this noise-dominated regime (B_simple ~ 12 B_small) one pair's product is mostly noise. Printed beside the
# check: about 17% here (measured 1.4% apart; 11% and 4.9% at GPT-2's 50,257 ids). The brute force sees the same
# rows, so the two differ by less than that; the check allows 10%, as the issue asks. A wrong scale (the buffer's
# 1/m, a missing average over the ranks) moves B_simple by a factor of 2 or more.
S = [n["trace_sigma_step"] for n in noise]
G = [n["grad_sq_step"] for n in noise]
mS, mG, n = statistics.fmean(S), statistics.fmean(G), len(S)
covariance = sum((s - mS) * (g - mG) for s, g in zip(S, G)) / (n - 1)
relative_error = math.sqrt((statistics.variance(S) / mS ** 2 + statistics.variance(G) / mG ** 2
                            - 2 * covariance / (mS * mG)) / n)
difference = abs(estimate - brute) / brute
check(difference <= 0.10, f"B_simple {estimate:.1f} tokens by the estimator, {brute:.1f} by brute force over "
      f"{K} microbatch gradients: {100 * difference:.1f}% apart (tol 10%; the estimator's own sampling error "
      f"~{100 * relative_error:.0f}%); tr(Sigma) {noise[-1]['trace_sigma']:.1f} vs {B_small * trace_B:.1f}, "
      f"|G|^2 {noise[-1]['grad_sq']:.4f} vs {grad_squared:.4f}")
print(f"RESULT {sum(results)} {len(results) - sum(results)}")
EOF
grep -v '^RESULT' "$work/estimator.check"
add_python_result "$work/estimator.check"

echo "(b) the same noise-scale log on layouts with the same small batch"
model=(--heads 2 --channels 32 --vocab-size 512 --max-seq-len 32 --seq-len 16 --layers 4 --learning-rate 1e-3
       "${quiet[@]}" "${data[@]}" --noise-scale 1)
# Llama's untied head: under a pipeline GPT-2's tied wte gradient is split between two stages (refused, (d))
flags=("${model[@]}" --arch llama --kv-heads 2 --total-batch-size 128)
run_steps=4
# one rank: 4 microbatches of 2 rows; it checkpoints at step 2 for (c)
layouts="one:1:2:--checkpoint-every,2
         pp2_1f1b:2:2:--pp,2
         tp2:2:2:--tp,2
         tp2_sp_zero2:2:2:--tp,2,--sequence-parallel,--zero,2
         dp2_zero1:2:2:--zero,1
         dp2_zero3:2:2:--zero,3
         tp2_dp2:4:2:--tp,2,--zero,1"
run_layouts "$layouts"
/usr/bin/python3 - "$work" >"$work/layouts.check" <<'EOF'
import json, sys
work = sys.argv[1]
def noise(name):
    return [e for e in (json.loads(line) for line in open(f"{work}/{name}/log.jsonl")) if e["event"] == "noise_scale"]
results = []
# The squared norms are sums of the same gradients in another order (split matmuls, chunks reduced over ranks):
# the layout tolerance, 1e-5 relative (scripts/test/layout_check.py). B_simple and the smoothed estimates are
# differences of those norms (|G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small), a small
# difference of two large terms while the noise dominates), which magnify their relative error by that
# cancellation: measured up to ~3e-6 here from norms within ~1e-7 (~2e-5 from ~2e-7 at GPT-2's 50,257 ids). So
# 1e-4 for those; another microbatch or a wrong scale moves them by 1e-2 and more.
FIELDS = {"small_norm_sq": 1e-5, "big_norm_sq": 1e-5, "grad_sq": 1e-4, "trace_sigma": 1e-4, "b_simple": 1e-4}
def compare(name, reference):
    mine, theirs = noise(name), noise(reference)
    if len(mine) != 4 or len(theirs) != 4:
        print(f"  FAIL {name}: {len(mine)} noise-scale events, {reference} {len(theirs)} (4 expected)")
        return False
    def error(a, b):  # relative; B_simple is null (as NaN is) while the smoothed |G|^2 is not positive
        return 0.0 if a is None and b is None else abs(a - b) / abs(b) if None not in (a, b) else float("inf")
    worst = {f: max(error(a[f], b[f]) for a, b in zip(mine, theirs)) for f in FIELDS}
    good = all(worst[f] <= FIELDS[f] for f in FIELDS) and all(
        (a["small_tokens"], a["big_tokens"]) == (b["small_tokens"], b["big_tokens"]) for a, b in zip(mine, theirs))
    words = ", ".join(f"{f} {worst[f]:.1e}" for f in FIELDS)
    print(f"  {'ok  ' if good else 'FAIL'} {name} against {reference}: 4 noise-scale events, worst relative "
          f"{words} (tol 1e-5 on the norms, 1e-4 on what is derived from them); B_simple by step "
          f"{[None if e['b_simple'] is None else round(e['b_simple']) for e in mine]}")
    return good
for name, reference in [("pp2_1f1b", "one"), ("tp2", "one"), ("tp2_sp_zero2", "one"), ("dp2_zero3", "dp2_zero1"),
                        ("tp2_dp2", "dp2_zero1")]:
    results.append(compare(name, reference))
print(f"RESULT {sum(results)} {len(results) - sum(results)}")
EOF
cat "$work/layouts.check" | grep -v '^RESULT'
add_python_result "$work/layouts.check"

echo "(c) a resumed run's noise scale"
mkdir -p "$work/resumed"
cp "$work/one/checkpoint_2.bin" "$work/resumed/"
run_layout resumed 1 2 --resume
noise_after_step2() {  # the noise-scale events of steps 3-4, without their time
    grep '"event": "noise_scale"' "$work/$1/log.jsonl" | sed 's/, "time_s": [^}]*//' | grep -v '"step": [12],'
}
if [[ $(noise_after_step2 resumed | wc -l) -eq 2 ]] && diff <(noise_after_step2 one) <(noise_after_step2 resumed) >/dev/null; then
    ok "resumed at step 2: the noise-scale events of steps 3-4 are the uninterrupted run's, bit for bit"
else
    bad "resumed at step 2: the noise-scale events differ: $(diff <(noise_after_step2 one) <(noise_after_step2 resumed) | head -4)"
fi

echo "(d) layouts refused"
refused_flags=("${model[@]}" --model custom --batch-size 2 --steps 1)
moe=(--arch llama --kv-heads 2 --ffn-hidden 32 --experts 4 --experts-per-token 2)
expect_refused "cp 2" "--noise-scale with --cp 2" 2 --cp 2 --total-batch-size 128
expect_refused "ep 2" "--noise-scale with --ep 2" 2 --ep 2 "${moe[@]}" --total-batch-size 128
expect_refused "tp 2 + SP at ZeRO-1" "--noise-scale with --tp 2 and --sequence-parallel" 2 --tp 2 --sequence-parallel \
    --zero 1 --total-batch-size 128
expect_refused "pp 2, tied embeddings" "--noise-scale with --pp 2 and GPT-2's tied" 2 --pp 2 --total-batch-size 128
expect_refused "pp 2 zb-h1" "--noise-scale with --pp-schedule zb-h1" 2 --pp 2 --pp-schedule zb-h1 --arch llama \
    --total-batch-size 128
expect_refused "one microbatch on one rank" "--noise-scale with one microbatch" 1 --total-batch-size 32
finish
