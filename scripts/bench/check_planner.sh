#!/usr/bin/env bash
# The planner against runs: trains 31 layouts of the CPU build (train_gpt_fp32_cpu) for a few steps each,
# measures their step time, and sets each beside what --plan --machine PROFILE estimates for the same flags.
#
# The layouts: data parallelism with ZeRO 0-3, tp with and without sequence parallelism, pp 2 under each
# schedule (gpipe, 1f1b, interleaved V 2, zb-h1, zbv), cp 2 ring and Ulysses, ep on a mixture of experts,
# recompute selective, full and per-block letters; three models (4 layers of 128 or 256 channels, and a
# mixture of 4 experts in the Llama block) and three global batches; 8 of them on 4 ranks (mpirun
# --oversubscribe: the ranks share the host's cores, as the profile's cores_per_node tells the planner).
# Tiny models on the classics folded into 512 token ids (scripts/test/test_lib.sh's folded_data): at GPT-2's
# 50,257 the LM head and its loss would be most of every step, and the layouts' differences would hide.
#
# Measured: rank 0's wall time of each step (log.jsonl's "ms"), the median of steps 3 to 7 of 8 (the first
# two pay for warm-up: first touches, OpenBLAS's buffers; under pp the last step measures its pipeline
# timeline). Predicted: the "estimated step" line of --plan RANKS --machine PROFILE with the run's flags.
# Printed: the table (layout, ranks, measured ms, predicted ms, error = predicted / measured - 1), then three
# verdicts, each a PASS or FAIL line:
#   the median |error| over the layouts       at most 15%
#   Spearman's rank correlation               at least 0.9 (ties take their mean rank)
#   the planner's pick                        the 4-rank layouts of the 256-channel model on one global batch
#                                             (group "pick": the same work per step, laid out 7 ways): the one
#                                             the planner estimates fastest measures within 10% of the fastest
#                                             measured
# and writes the table as markdown (OUT/check.md) and the picture of predicted against measured
# (OUT/predicted_vs_measured.png; OUT default docs/planner). Exits non-zero when a verdict fails or a run fails.
#
#   usage: scripts/bench/check_planner.sh [PROFILE] [RUNS]
# PROFILE: a machine profile (llmc/planning/hardware.h's format); none: scripts/bench/calibrate.sh writes this
# machine's first (build/machine.profile). RUNS: a directory that keeps every run (default: a fresh temporary
# one); a layout whose 8 steps are already there, run with the same flags, is not run again, so a changed cost model can be checked
# against the same measurements (the profile must be this machine's, from the same quiet state).
# Takes about 5 minutes on a quiet 2-core host; other work on the host inflates the measured times.
# On a GPU machine (nvidia-smi lists a GPU) it checks one GPU instead: ./train_gpt (BF16) on 12 single-GPU layouts
# (GPT-2 124M to 1558M, recompute none/selective/full, batch, sequence length and accumulation, a 16-layer Llama, a
# mixture of 8 experts) on the corpus (make data), 12 steps each, steps 4-11 measured; no MPI launcher; the profile
# calibrate.sh writes there (one GPU: the compute alone); no pick (one GPU has no layouts of the same work to choose
# between: said so, not counted); the table and picture in OUT default docs/planner/gpu. About 6-8 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${1:-}
runs=${2:-}
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [[ $gpus -gt 0 ]]; then
    python=$(command -v python3)
    binary=./train_gpt
else
    python=/usr/bin/python3
    binary=./train_gpt_fp32_cpu
    export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
    if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
fi
if ! $python -c "import matplotlib" 2>/dev/null; then
    echo "check_planner.sh: needs python3-matplotlib (apt-get install python3-matplotlib)"
    exit 1
fi
if [[ -z $profile ]]; then
    [[ -f scripts/bench/calibrate.sh ]] ||
        { echo "check_planner.sh: no PROFILE given and no scripts/bench/calibrate.sh to measure one"; exit 1; }
    bash scripts/bench/calibrate.sh
    profile=build/machine.profile
fi
[[ -f $profile ]] || { echo "check_planner.sh: no profile at $profile"; exit 1; }
if ! make --no-print-directory -s "${binary#./}" >/dev/null; then
    [[ -x $binary ]] || { echo "check_planner.sh: no $binary, and make could not build it"; exit 1; }
    echo "warning: make could not build $binary: the runs use the one already here"
fi
source scripts/test/test_lib.sh  # folded_data; a scratch $work, removed at exit
runs=${runs:-$work}
out=${CHECK_OUT:-docs/planner}
[[ $gpus -gt 0 ]] && out=${CHECK_OUT:-docs/planner/gpu}
mkdir -p "$runs" "$out"
if [[ $gpus -gt 0 ]]; then
    # One GPU: GPT-2 and Llama shapes on the corpus at full vocabulary, 12 steps each (steps 4-11 measured: the first
    # pay for cuBLASLt's plans and the allocator's first touches)
    [[ -f data/classics_train.bin ]] || { echo "check_planner.sh: no data/classics_train.bin (make data)"; exit 1; }
    steps=12 first=4
    common=(--train-data data/classics_train.bin --val-every 0 --sample-tokens 0 --save-model false
            --checkpoint-every 0 --steps $steps)
    gpt2_124M=(--model 124M) gpt2_350M=(--model 350M) gpt2_774M=(--model 774M) gpt2_1558M=(--model 1558M)
    llama=(--model custom --arch llama --layers 16 --channels 2048 --heads 16 --kv-heads 8 --ffn-hidden 5632)
    moe=(--model custom --layers 12 --channels 768 --heads 12 --experts 8 --experts-per-token 2)
    layouts="g124:1:-:gpt2_124M:16:16384:--seq-len,1024
             g124_selective:1:-:gpt2_124M:16:16384:--seq-len,1024,--recompute,selective
             g124_full:1:-:gpt2_124M:16:16384:--seq-len,1024,--recompute,full
             g124_b4:1:-:gpt2_124M:4:4096:--seq-len,1024
             g124_t256:1:-:gpt2_124M:16:4096:--seq-len,256
             g124_accumulate:1:-:gpt2_124M:8:16384:--seq-len,1024
             g350:1:-:gpt2_350M:16:16384:--seq-len,1024
             g774:1:-:gpt2_774M:8:8192:--seq-len,1024
             g1558:1:-:gpt2_1558M:8:8192:--seq-len,1024
             llama16:1:-:llama:8:8192:--seq-len,1024
             llama16_selective:1:-:llama:8:8192:--seq-len,1024,--recompute,selective
             moe:1:-:moe:16:16384:--seq-len,1024"
else
    data=$runs/data
    [[ -f $data/train.bin ]] || folded_data "$data" 512
    steps=8 first=3
    common=(--model custom --vocab-size 512 --max-seq-len 64 --seq-len 64 --lr-schedule constant --learning-rate 1e-3
            --train-data "$data/train.bin" --val-data "$data/val.bin" --tokenizer "$data/tokenizer.bin" --val-every 0
            --sample-tokens 0 --save-model false --steps $steps)
    small=(--layers 4 --channels 128 --heads 4)
    wide=(--layers 4 --channels 256 --heads 4)
    moe=(--arch llama --layers 4 --channels 128 --heads 4 --kv-heads 2 --experts 4 --experts-per-token 2)
    # name:ranks:group:model:B:total tokens:flags (commas for spaces); B rows per data-parallel rank and micro-step
    layouts="one:1:-:small:16:1024:
             b512_one:1:-:small:8:512:
             dp2:2:-:small:8:1024:
             dp2_zero1:2:-:small:8:1024:--zero,1
             dp2_zero2:2:-:small:8:1024:--zero,2
             dp2_zero3:2:-:small:8:1024:--zero,3
             b2048_dp2:2:-:small:16:2048:
             tp2:2:-:small:16:1024:--tp,2
             tp2_sp:2:-:small:16:1024:--tp,2,--sequence-parallel
             pp2_gpipe:2:-:small:2:1024:--pp,2,--pp-schedule,gpipe
             pp2_1f1b:2:-:small:2:1024:--pp,2,--pp-schedule,1f1b
             pp2_interleaved:2:-:small:2:1024:--pp,2,--pp-schedule,interleaved,--pp-virtual,2
             pp2_zb-h1:2:-:small:2:1024:--pp,2,--pp-schedule,zb-h1
             pp2_zbv:2:-:small:2:1024:--pp,2,--pp-schedule,zbv
             cp2_ring:2:-:small:16:1024:--cp,2,--cp-mode,ring
             cp2_ulysses:2:-:small:16:1024:--cp,2,--cp-mode,ulysses
             selective:1:-:small:16:1024:--recompute,selective
             full:1:-:small:16:1024:--recompute,full
             blocks_ksfk:1:-:small:16:1024:--recompute-blocks,ksfk
             wide_one:1:-:wide:16:1024:
             wide_dp2_zero1:2:-:wide:8:1024:--zero,1
             wide_dp4:4:pick:wide:4:1024:
             wide_dp4_zero3:4:pick:wide:4:1024:--zero,3
             wide_dp2_tp2:4:pick:wide:8:1024:--tp,2
             wide_tp4_sp:4:pick:wide:16:1024:--tp,4,--sequence-parallel
             wide_pp4_1f1b:4:pick:wide:2:1024:--pp,4,--pp-schedule,1f1b
             wide_dp2_pp2_zbv:4:pick:wide:2:1024:--pp,2,--pp-schedule,zbv
             wide_dp2_cp2_ring:4:pick:wide:8:1024:--cp,2
             moe_one:1:-:moe:16:1024:
             moe_ep2:2:-:moe:8:1024:--ep,2
             moe_ep4_full:4:-:moe:4:1024:--ep,4,--recompute,full"
fi

table=$runs/layouts.tsv
: >"$table"
echo "$(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the runs; profile $profile"
for entry in $layouts; do
    IFS=: read -r name ranks group model batch total flag_list <<<"$entry"
    declare -n model_flags=$model
    flags=("${common[@]}" "${model_flags[@]}" --batch-size "$batch" --total-batch-size "$total" ${flag_list//,/ })
    if [[ $(grep -c '"event": "step"' "$runs/$name/log.jsonl" 2>/dev/null) != "$steps" ||
          $(cat "$runs/$name.flags" 2>/dev/null) != "$ranks ${flags[*]}" ]]; then
        rm -rf "${runs:?}/$name"
        echo "$ranks ${flags[*]}" >"$runs/$name.flags"
        launcher=(mpirun --oversubscribe --allow-run-as-root -np "$ranks")
        [[ $gpus -gt 0 ]] && launcher=()  # one GPU: a rank alone, started as a user would (no MPI launcher needed)
        "${launcher[@]}" "$binary" "${flags[@]}" --output-dir "$runs/$name" \
            >"$runs/$name.out" 2>&1 || { echo "check_planner.sh: the $name run failed:"; tail -3 "$runs/$name.out"; exit 1; }
    fi
    "$binary" "${flags[@]}" --plan "$ranks" --machine "$profile" >"$runs/$name.plan" 2>&1 ||
        { echo "check_planner.sh: --plan of $name failed: $(tail -1 "$runs/$name.plan")"; exit 1; }
    printf '%s\t%s\t%s\t%s\n' "$name" "$ranks" "$group" "$model, B $batch, $total tokens ${flag_list//,/ }" >>"$table"
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) after the runs"
$python scripts/planner_check.py "$runs" --first $first --last $((steps - 1)) --markdown "$out/check.md" \
    --picture "$out/predicted_vs_measured.png" --build "$([[ $gpus -gt 0 ]] && echo "one GPU" || echo "the CPU build")" --note "$(nproc --all) cores, profile $(basename "$profile"), $(date -u +%F)"
