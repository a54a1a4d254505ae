#!/usr/bin/env bash
# Stages of any size and the zero-bubble schedules against one rank: a 9-layer model (no pp here divides it),
# the same global batch (8 rows of 16 tokens), 3 steps, with a validation loss and a text sample at the end
# (mpirun, CPU build, FP32). B sets the microbatches m = 8 / (B x data-parallel ranks). Every layout's losses
# must agree with the single rank's within 1e-5 relative, and so must its final model.bin (in norm) and its
# validation losses (scripts/test/layout_check.py says why that tolerance); the sample must be the same text.
# The matrix: stages balanced by cost (--pp-layers auto, the default) and given as a list, under 1f1b, gpipe and
# interleaved; zb-h1 and zbv each at pp 2 and pp 4, and at pp 2 with dp 2 x ZeRO-3, with tp 2 + sequence
# parallelism (and selective recomputation), with cp 2, and with full recomputation. For each: the bytes rank 0
# sent on the pp axis in the last step against pipeline_bytes_per_step, exactly; the memory rank 0 held against
# llmc/planning/memory.h's formula, exactly; the records in flight at each pp rank's peak against the schedule's
# formula. With dp 2, also the bytes rank 0 sent to its data-parallel group in the last step against
# scripts/test/layout_check.py's dp_bytes, exactly: ZeRO-3 reduces each of the rank's chunks every microbatch,
# the embedding chunk included (reduced once per step, it would send (m - 1) e s / 2 too few, e its elements),
# and gathers the blocks as often as the rank's order of passes, read from the run's trace, asks for them.
# Also: a checkpoint saved by an even split (pp 3, 3 layers each) resumed by an uneven one (zbv at
# pp 2: 4 stages in a V), and impossible splits refused with one error line. Every point-to-point send is synchronous
# (MPI_Issend, llmc/parallel/cpu_nccl_rules.h), as NCCL's are, and the layouts alternate between two orders of a group's
# communicators (LLMC_CPU_GROUP_ORDER=hash, reverse). Two structures that deadlock on GPUs must deadlock here:
# sends and receives issued one at a time, and a communicator per link run in each rank's own order.
#   usage: scripts/test/test_pipeline_stages.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
run_steps=3  # a step after the first (which may allocate) for the budget, and one after the checkpoint of step 2

# the classics folded into 512 token ids (test_lib.sh's folded_data): the layouts are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--layers 9 --heads 4 --channels 64 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --sample-tokens 8
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin"
       --tokenizer "$work/data/tokenizer.bin" --total-batch-size 128)
# validation reads --val-batches batches of B x data-parallel ranks rows: every run measures the same 16 rows
run() {  # run NAME RANKS B DATA_PARALLEL_RANKS [FLAGS...]
    local name=$1 ranks=$2 batch=$3 dp=$4
    shift 4
    run_layout "$name" "$ranks" "$batch" --val-batches $((16 / (batch * dp))) "$@"
}
run one 1 8 1
# name:ranks:B:data-parallel ranks:flags (commas for spaces, + for the commas of a --pp-layers list)
layouts="pp2_auto_1f1b:2:2:1:--pp,2
         pp4_list_gpipe:4:1:1:--pp,4,--pp-schedule,gpipe,--pp-layers,3+2+2+2
         pp2_v2_list_interleaved:2:2:1:--pp,2,--pp-schedule,interleaved,--pp-virtual,2,--pp-layers,2+3+2+2
         zbh1_pp2:2:2:1:--pp,2,--pp-schedule,zb-h1
         zbh1_pp4:4:1:1:--pp,4,--pp-schedule,zb-h1,--trace,TRACE
         zbh1_pp2_dp2_zero3:4:1:2:--pp,2,--pp-schedule,zb-h1,--zero,3,--trace,TRACE
         zbh1_pp2_tp2_sp_selective:4:2:1:--pp,2,--pp-schedule,zb-h1,--tp,2,--sequence-parallel,--recompute,selective
         zbh1_pp2_cp2:4:2:1:--pp,2,--pp-schedule,zb-h1,--cp,2
         zbh1_pp2_full:2:2:1:--pp,2,--pp-schedule,zb-h1,--recompute,full,--recompute-every,2
         zbv_pp2:2:2:1:--pp,2,--pp-schedule,zbv
         zbv_pp4:4:1:1:--pp,4,--pp-schedule,zbv
         zbv_pp2_dp2_zero3:4:1:2:--pp,2,--pp-schedule,zbv,--zero,3,--trace,TRACE
         zbv_pp2_tp2_sp_selective:4:2:1:--pp,2,--pp-schedule,zbv,--tp,2,--sequence-parallel,--recompute,selective
         zbv_pp2_cp2:4:2:1:--pp,2,--pp-schedule,zbv,--cp,2
         zbv_pp2_full:2:2:1:--pp,2,--pp-schedule,zbv,--recompute,full,--recompute-every,2"
# NCCL may run a group's communicators in either order (llmc/parallel/cpu_nccl_rules.h): the layouts alternate between
# the CPU build's hash order and its reverse, so that every schedule runs under both
orders=(hash reverse) index=0 reversed=""
for layout in $layouts; do
    IFS=: read -r name ranks batch dp layout_flags <<<"$layout"
    layout_flags=${layout_flags//TRACE/$work/$name.trace.json}
    layout_flags=${layout_flags//,/ }
    export LLMC_CPU_GROUP_ORDER=${orders[index++ % 2]}
    [[ $LLMC_CPU_GROUP_ORDER == reverse ]] && reversed+=" $name"
    run "$name" "$ranks" "$batch" "$dp" ${layout_flags//+/,}
done
unset LLMC_CPU_GROUP_ORDER

# a checkpoint saved at step 2 by an even split (pp 3: 3 layers each) resumed by the balanced split of zbv at
# pp 2 (4 stages, rank 0 holding the first and the last); the last step must match the uninterrupted single rank
run saved_even 3 2 1 --pp 3 --pp-layers 3,3,3 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/resumed_uneven" && cp "$work"/saved_even/checkpoint_2* "$work/resumed_uneven/"
run resumed_uneven 2 2 1 --pp 2 --pp-schedule zbv --resume

echo "pipeline stages of any size and zero-bubble schedules vs one rank ($binary)"
echo "  groups in reverse communicator order (the others in hash order):$reversed"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" $layouts >"$work/compare.out" <<'PYTHON' || true
import json, sys
from layout_check import (compare_resumed, compare_run, dp_bytes, events, memory_against_formula, pp_bytes, report,
                          result, trace_passes)
work, layouts = sys.argv[1], [l.split(":") for l in sys.argv[2:]]
def flag(flags, name, default):
    return flags[flags.index(name) + 1] if name in flags else default

results = []
for name, ranks, batch, dp, flags in layouts:
    flags = flags.split(",")
    B, dp = int(batch), int(dp)
    p, tp, cp = int(flag(flags, "--pp", 1)), int(flag(flags, "--tp", 1)), int(flag(flags, "--cp", 1))
    schedule, zero = flag(flags, "--pp-schedule", "1f1b"), int(flag(flags, "--zero", 0))
    V = 2 if schedule == "zbv" else int(flag(flags, "--pp-virtual", 1))
    m = 8 // (B * dp)
    try:
        same_run, run_words = compare_run(work, name, "one", steps=3, validations=2, sample=True)
        theory = pp_bytes(schedule, p, V, m, B, seq_len=16 // cp, channels=64, max_seq_len=32, padded_vocab=512,
                          tp=tp, sp="--sequence-parallel" in flags, shards=dp * cp, zero=zero)
        sent = events(work, name, "step")[-1]["pp_comm_bytes"]
        same_memory, memory_words, _ = memory_against_formula(work, name)
        pipeline = events(work, name, "pipeline")[-1]
        peaks, formula = pipeline["peak_records"], pipeline["peak_records_formula"]
        same_layout = (pipeline["schedule"], pipeline["pp"], pipeline["microbatches"]) == (schedule, p, m)
        good = same_run and sent == theory and same_memory and peaks == formula and same_layout
        words = (f"{run_words}; pp axis sent {sent} B/step, formula {theory}; {memory_words}; peak records {peaks}, "
                 f"formula {formula}; layers per stage {pipeline['stage_layers']}")
        if dp > 1:  # what rank 0 sent to neither its tp, pp nor cp group went to its data-parallel group
            step = events(work, name, "step")[-1]
            dp_sent = step["comm_bytes"] - step["tp_comm_bytes"] - step["pp_comm_bytes"] - step["cp_comm_bytes"]
            passes = trace_passes(f"{work}/{name}.trace.json") if zero == 3 else None
            dp_theory = dp_bytes(schedule, p, V, m, pipeline["stage_layers"], zero, dp, channels=64, max_seq_len=32,
                                 padded_vocab=512, passes=passes)
            good &= dp_sent == dp_theory
            words += f"; data-parallel group sent {dp_sent} B/step, formula {dp_theory}"
    except Exception as error:  # a run that failed left no log or no model
        good, words = False, f"no result ({error!r})"
    results.append(report(good, f"{name:26} {ranks} ranks, m {m}: {words}"))

# zb-h1's trace: every pp rank's m forwards, m B and m W passes, as work
try:
    trace = json.load(open(f"{work}/zbh1_pp4.trace.json"))
    kinds = [sorted({e["name"][0] for e in trace["traceEvents"] if e.get("cat") == "work" and e["tid"] == r})
             for r in range(4)]
    counts = [len([e for e in trace["traceEvents"] if e.get("cat") == "work" and e["tid"] == r]) for r in range(4)]
    good = counts == [3 * 8] * 4 and kinds == [["B", "F", "W"]] * 4
except (OSError, ValueError, KeyError) as error:
    counts, good = str(error), False
results.append(report(good, f"--trace of zb-h1 at pp 4, m 8: work events per pp rank {counts} (expected 24: F, B, W)"))
try:
    results.append(compare_resumed(work, "resumed_uneven", "one", 2,
                                   "saved by an even split (pp 3: 3,3,3), resumed by a balanced one (pp 2, zbv)"))
except Exception as error:
    results.append(report(False, f"resume across splits: no result ({error!r})"))
result(results)
PYTHON
grep -v '^RESULT' "$work/compare.out"

# the structure NCCL deadlocks on: each result sent at once, each send and receive issued alone
# (LLMC_FAULT_UNGROUPED_P2P, llmc/cpu/faults.h), 1f1b at pp 2, m 4. Under synchronous sends the two ranks' lone sends of the steady state wait for each other,
# and the watchdog ends the run; the same run grouped (pp2_auto_1f1b above) completes.
LLMC_FAULT_UNGROUPED_P2P=1 timeout 120 mpirun --oversubscribe --allow-run-as-root -np 2 "$binary" "${flags[@]}" \
    --model custom --batch-size 2 --pp 2 --steps 1 --collective-timeout 3 \
    --output-dir "$work/ungrouped" >"$work/ungrouped.out" 2>&1
status=$?
deadlock=$(grep -m1 "^error: rank [01] waited [0-9]* s in send to rank [01] on the pp link 0-1 group" "$work/ungrouped.out")
if [[ $status -ne 0 && $status -ne 124 && -n $deadlock ]]; then
    ok "sends and receives issued one at a time deadlock 1f1b at pp 2 under synchronous sends: $deadlock"
else
    bad "the ungrouped structure was expected to deadlock (exit $status): $(grep -m2 error: "$work/ungrouped.out")"
fi

# the structure the pipeline had before its messages moved to the pp axis: a communicator per neighbour link and
# zbv chunk (LLMC_FAULT_PER_LINK_P2P), under the order in which each rank runs its group's communicators as it
# first names them. dev/test/test_pipeline.cu's simulator says every zbv layout deadlocks so; the watchdog must
# end the run, and the same layout on the pp axis (zbv_pp2 above) completes.
LLMC_FAULT_PER_LINK_P2P=1 LLMC_CPU_GROUP_ORDER=issue timeout 120 mpirun --oversubscribe --allow-run-as-root -np 2 \
    "$binary" "${flags[@]}" --model custom --batch-size 2 --pp 2 --pp-schedule zbv --steps 1 --collective-timeout 3 \
    --output-dir "$work/per_link" >"$work/per_link.out" 2>&1
status=$?
deadlock=$(grep -m1 "^error: rank [01] waited [0-9]* s in [a-z]* [a-z]* rank [01] on the pp link 0-1 chunk [01] group" \
    "$work/per_link.out")
if [[ $status -ne 0 && $status -ne 124 && -n $deadlock ]]; then
    ok "a communicator per link deadlocks zbv at pp 2 when each rank runs them in its own order: $deadlock"
else
    bad "the per-link structure was expected to deadlock (exit $status): $(grep -m2 error: "$work/per_link.out")"
fi

# impossible splits: one "error:" line naming the problem, a non-zero exit
refused_flags=(--model custom --max-seq-len 64 --seq-len 16 --train-data data/classics_train.bin --val-every 0
               --sample-tokens 0)
expect_refused "more stages than layers" "2 layers cannot be cut into 4 stages" 2 --layers 2 --pp 2 \
    --pp-schedule interleaved --pp-virtual 2
expect_refused "a list of the wrong length" "--pp-layers lists 3 stages" 2 --layers 4 --pp 2 --pp-layers 1,1,2
expect_refused "a list of the wrong sum" "--pp-layers adds up to 5 layers" 2 --layers 4 --pp 2 --pp-layers 2,3
expect_refused "an empty stage" "'4,0' is not auto or a comma-separated list of positive layer counts" 2 --layers 4 \
    --pp 2 --pp-layers 4,0

add_python_result "$work/compare.out"
finish
