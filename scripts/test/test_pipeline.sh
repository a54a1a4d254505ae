#!/usr/bin/env bash
# Pipeline parallelism against one rank: the same 4-layer model, the same global batch (8 rows of 16
# tokens), 3 steps, with a validation loss and a text sample at the end (mpirun, CPU build, FP32). The
# global batch stays fixed and B sets the microbatches m = 8 / (B x data-parallel ranks): every layout's
# losses must agree with the single rank's within 1e-5 relative, and so must its final model.bin (in norm)
# and its validation losses: a pipeline only moves layers to other ranks and cuts the batch into
# microbatches, which changes the order of additions (the gradient is summed over m microbatches instead
# of over one batch), nothing else. The sample must be the same text.
# The matrix: pp 2 and pp 4 under gpipe and 1f1b at m = 1, p and 2p; interleaved at pp 2 x V 2 (m = p and
# 2p: the warm-up covers everything at m = p, not at 2p); pp 2 x dp 2 at ZeRO-1 and ZeRO-3; pp 2 x tp 2
# with sequence parallelism. For each: the bytes rank 0 sent on the pp axis in the last step against
# pipeline_bytes_per_step (llmc/parallel/pipeline.h), exactly; the activation and workspace memory rank 0 held
# against llmc/planning/memory.h's formula, exactly; the records in flight at each pp rank's peak against the
# schedule's formula (llmc/parallel/pipeline_schedule.h); and 1f1b holding fewer activations than gpipe at m = 2p.
# The layouts alternate between two orders of a group's communicators (LLMC_CPU_GROUP_ORDER=hash, reverse).
# Also: checkpoints saved at pp 2 x dp 2 and resumed at pp 1 and pp 4, one rank's model.bin loaded at pp 4,
# the trace of an interleaved step, and impossible layouts refused with one error line.
#   usage: scripts/test/test_pipeline.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

# 4 layers: pp 4 leaves one layer per rank, pp 2 x V 2 one per stage; 4 heads split over tp 2
# the classics folded into 512 token ids (test_lib.sh's folded_data): the layouts are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--layers 4 --heads 4 --channels 64 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --sample-tokens 8
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin"
       --tokenizer "$work/data/tokenizer.bin" --total-batch-size 128)
# validation reads --val-batches batches of B x data-parallel ranks rows, in file order: every run measures
# the same 16 rows (2 batches of the one rank's 8), whatever its B and data-parallel ranks
validation_rows=16
run() {  # run NAME RANKS B [FLAGS...]: 3 steps unless given (a step after the first, which may allocate, for the
         # budget, and one after the checkpoint of step 2)
    local name=$1 ranks=$2 batch=$3
    shift 3
    local extra=("$@") pp=1 tp=1 i
    for ((i = 0; i < ${#extra[@]} - 1; i++)); do
        [[ ${extra[i]} == --pp ]] && pp=${extra[i + 1]}
        [[ ${extra[i]} == --tp ]] && tp=${extra[i + 1]}
    done
    [[ " ${extra[*]} " == *" --steps "* ]] || extra+=(--steps 3)
    [[ " ${extra[*]} " == *" --model "* ]] || extra+=(--model custom)
    if mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" --batch-size "$batch" \
        --val-batches $((validation_rows / (batch * ranks / (pp * tp)))) --output-dir "$work/$name" "${extra[@]}" \
        >>"$work/$name.out" 2>&1; then
        steady_steps "${extra[@]}" && host_calls_within_budget "$name"
    else
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
    fi
}
run one 1 8
# name:ranks:B:flags (commas for spaces). pp2_dp2_zero1 also saves the checkpoints resumed below.
layouts="pp2_gpipe_m1:2:8:--pp,2,--pp-schedule,gpipe pp2_gpipe_m2:2:4:--pp,2,--pp-schedule,gpipe
         pp2_gpipe_m4:2:2:--pp,2,--pp-schedule,gpipe pp2_1f1b_m1:2:8:--pp,2,--pp-schedule,1f1b
         pp2_1f1b_m2:2:4:--pp,2,--pp-schedule,1f1b pp2_1f1b_m4:2:2:--pp,2,--pp-schedule,1f1b
         pp4_gpipe_m1:4:8:--pp,4,--pp-schedule,gpipe pp4_gpipe_m4:4:2:--pp,4,--pp-schedule,gpipe
         pp4_gpipe_m8:4:1:--pp,4,--pp-schedule,gpipe pp4_1f1b_m1:4:8:--pp,4,--pp-schedule,1f1b
         pp4_1f1b_m4:4:2:--pp,4,--pp-schedule,1f1b pp4_1f1b_m8:4:1:--pp,4,--pp-schedule,1f1b
         pp2_v2_m2:2:4:--pp,2,--pp-schedule,interleaved,--pp-virtual,2
         pp2_v2_m4:2:2:--pp,2,--pp-schedule,interleaved,--pp-virtual,2,--trace,TRACE
         pp2_dp2_zero1:4:2:--pp,2,--zero,1,--checkpoint-every,2,--keep-checkpoints,5
         pp2_dp2_zero3:4:1:--pp,2,--zero,3 pp2_tp2_sp:4:2:--pp,2,--tp,2,--sequence-parallel"
# NCCL may run a group's communicators in either order (llmc/parallel/cpu_nccl_rules.h): the layouts alternate between
# the CPU build's hash order and its reverse, so that every schedule runs under both
orders=(hash reverse) index=0 reversed=""
for layout in $layouts; do
    IFS=: read -r name ranks batch layout_flags <<<"$layout"
    layout_flags=${layout_flags//TRACE/$work/trace.json}
    export LLMC_CPU_GROUP_ORDER=${orders[index++ % 2]}
    [[ $LLMC_CPU_GROUP_ORDER == reverse ]] && reversed+=" $name"
    run "$name" "$ranks" "$batch" ${layout_flags//,/ }
done
unset LLMC_CPU_GROUP_ORDER

# checkpoints across pp sizes: saved at step 2 by pp 2 x dp 2 at ZeRO-1 (B 2: 4 rows per micro-step, which
# the data loader's position needs kept), resumed by one rank and by pp 4 (B 4, m 2); the last step must
# match the uninterrupted single rank
for name in resumed_pp1 resumed_pp4; do mkdir -p "$work/$name" && cp "$work"/pp2_dp2_zero1/checkpoint_2* "$work/$name/"; done
run resumed_pp1 1 4 --resume
run resumed_pp4 4 4 --pp 4 --resume
# a model file (the whole model, llm.c's format) loads into any pipeline: one rank's model.bin trained on for
# 2 more steps by one rank and at pp 4 (B 2, m 4)
run from_file_one 1 8 --model "$work/one/model.bin" --steps 2
run from_file_pp4 4 2 --model "$work/one/model.bin" --steps 2 --pp 4

echo "pipeline parallelism vs one rank ($binary)"
echo "  groups in reverse communicator order (the others in hash order):$reversed"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" $layouts >"$work/compare.out" <<'EOF' || true
import json, sys
from layout_check import (compare_continued, compare_resumed, compare_run, events, memory_against_formula, pp_bytes,
                          report, result)
work, layouts = sys.argv[1], [l.split(":") for l in sys.argv[2:]]
def flag(flags, name, default):
    return flags[flags.index(name) + 1] if name in flags else default

# records in flight at the peak of pp rank r (pipeline_peak_activations in llmc/parallel/pipeline_schedule.h)
def peak_records(schedule, r, p, m, V):
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - r, m)
    warmup = min((p - r - 1) * 2 + (V - 1) * p, m * V)
    return m * V if warmup == m * V else warmup + 1

results, activations = [], {}
for name, ranks, batch, flags in layouts:
    flags = flags.split(",")
    ranks, B = int(ranks), int(batch)
    p, tp, V = int(flag(flags, "--pp", 1)), int(flag(flags, "--tp", 1)), int(flag(flags, "--pp-virtual", 1))
    schedule, zero = flag(flags, "--pp-schedule", "1f1b"), int(flag(flags, "--zero", 0))
    sp = "--sequence-parallel" in flags
    dp = ranks // (p * tp)
    m = 8 // (B * dp)
    same_run, run_words = compare_run(work, name, "one", steps=3, validations=2, sample=True)
    theory = pp_bytes(schedule, p, V, m, B, seq_len=16, channels=64, max_seq_len=32, padded_vocab=512, tp=tp, sp=sp,
                      shards=dp, zero=zero)
    sent = events(work, name, "step")[-1]["pp_comm_bytes"]
    same_memory, memory_words, memory = memory_against_formula(work, name)
    activations[name] = memory["activation_bytes"]
    pipeline = (events(work, name, "pipeline") or [{}])[-1]
    peaks = pipeline.get("peak_records")
    expected_peaks = [peak_records(schedule, r, p, m, V) for r in range(p)]
    same_layout = (pipeline.get("schedule"), pipeline.get("pp"), pipeline.get("microbatches"),
                   pipeline.get("virtual_stages")) == (schedule, p, m, V)
    good = same_run and sent == theory and same_memory and peaks == expected_peaks and same_layout
    results.append(report(good, f"{name:14} {ranks} ranks, m {m}: {run_words}; pp axis sent {sent} B/step, formula "
                                f"{theory}; {memory_words}; peak records {peaks}, formula {expected_peaks}" +
                                ("" if same_layout else f"; the pipeline event says {pipeline}")))

# 1f1b's point: at m = 2p rank 0 holds min(p, m) = p records, gpipe's m = 2p
for p, m in [(2, 4), (4, 8)]:
    gpipe, one_f = activations[f"pp{p}_gpipe_m{m}"], activations[f"pp{p}_1f1b_m{m}"]
    results.append(report(one_f < gpipe, f"rank 0's activations at pp {p}, m {m}: 1f1b {one_f} B < gpipe {gpipe} B "
                                         f"({one_f / gpipe:.3f})"))

# the interleaved step's trace: every pp rank's m V forwards and m V backwards, as work
try:
    trace = json.load(open(f"{work}/trace.json"))
    work_events = [[e for e in trace["traceEvents"] if e.get("cat") == "work" and e["tid"] == r] for r in range(2)]
    counts = [len(w) for w in work_events]
    good = counts == [2 * 4 * 2] * 2 and trace["otherData"]["microbatches"] == 4
except (OSError, ValueError, KeyError) as error:
    counts, good = str(error), False
results.append(report(good, f"--trace of pp 2 x V 2, m 4: work events per pp rank {counts} (expected 16 each)"))

results.append(compare_resumed(work, "resumed_pp1", "one", 2, "saved at pp 2 x dp 2 (ZeRO-1), resumed on one rank"))
results.append(compare_resumed(work, "resumed_pp4", "one", 2, "saved at pp 2 x dp 2 (ZeRO-1), resumed at pp 4"))
results.append(compare_continued(work, "from_file_pp4", "from_file_one", 2, "a model file loaded at pp 4 (m 4)"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"

# impossible layouts: one "error:" line naming the problem, a non-zero exit (expect_refused in test_lib.sh);
# every run has the default 4 heads of 256 channels and 16 tokens unless the flags say otherwise
refused_flags=(--model custom --max-seq-len 64 --seq-len 16 --train-data data/classics_train.bin --val-every 0
               --sample-tokens 0)
expect_refused "fewer layers than stages" "2 layers cannot be cut into 4 stages" 4 --layers 2 --pp 4
expect_refused "world size not a multiple of pp" "the 3 ranks are not a multiple of --pp 2" 3 --layers 2 --pp 2
expect_refused "interleaved, microbatches not a multiple of pp" "needs the microbatches (3" 2 --layers 4 --pp 2 \
    --pp-schedule interleaved --pp-virtual 2 --batch-size 1 --total-batch-size 48
expect_refused "virtual stages without the interleaved schedule" "only the interleaved schedule has virtual stages" 2 \
    --layers 4 --pp 2 --pp-schedule 1f1b --pp-virtual 2
expect_refused "interleaved on one pipeline rank" "the interleaved schedule needs --pp at least 2" 1 --layers 2 \
    --pp-schedule interleaved

add_python_result "$work/compare.out"
finish
