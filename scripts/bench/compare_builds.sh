#!/usr/bin/env bash
# Is a change behaviour-neutral? Builds the CPU FP32 trainer at an earlier commit beside this tree's, runs both
# on the same layouts (one rank, ZeRO-3 on 2 ranks, tp 2 + SP, pp 2 under 1f1b and zbv, cp 2 ring, ep 2 with a
# capacity, a mixture in every 2nd block under zbv, the 16-rank 4-D layout), and compares what each run left:
# model.bin byte for byte (cmp), and log.jsonl event by event without the fields that measure time (and the
# pipeline's measured bubbles), in the fields the old build's log has (fields the new build adds, and flags it
# no longer has, are listed, not compared). Numbers are compared as float32, so "0.00999999978" and "0.01" (one float,
# printed two ways) agree. A refactoring that claims "bit for bit" passes every line here.
#   usage: scripts/bench/compare_builds.sh OLD_COMMIT [LAYOUT_NAME...]    (all layouts when none is named)
set -u
old=${1:?usage: $0 OLD_COMMIT [LAYOUT_NAME...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap '[[ -n ${KEEP:-} ]] || { git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1; rm -rf "$work"; }' EXIT
export OMP_NUM_THREADS=1

echo "building train_gpt_fp32_cpu at $old and at the working tree"
git -C "$root" worktree add --detach "$work/old" "$old" >/dev/null 2>&1 || { echo "error: cannot check out $old"; exit 1; }
make -C "$work/old" train_gpt_fp32_cpu >"$work/old_build.out" 2>&1 || { echo "error: $old does not build"; exit 1; }
make -C "$root" train_gpt_fp32_cpu >"$work/new_build.out" 2>&1 || { echo "error: the working tree does not build"; exit 1; }

common=(--heads 4 --channels 64 --vocab-size 50257 --max-seq-len 32 --seq-len 16 --lr-schedule constant
        --learning-rate 1e-3 --val-every 5 --val-batches 2 --sample-tokens 8 --total-batch-size 256 --steps 5
        --model custom --train-data "$root/data/classics_train.bin" --val-data "$root/data/classics_val.bin")
moe=(--arch llama --kv-heads 2 --ffn-hidden 32 --experts 4 --experts-per-token 2 --shared-experts 1)
# name:ranks:flags (commas for spaces); 16 rows of 16 tokens a step, as micro-steps or microbatches of B rows
layouts="one:1:--layers,2,--batch-size,8
         dp2_zero3:2:--layers,2,--batch-size,4,--zero,3
         tp2_sp:2:--layers,2,--batch-size,8,--tp,2,--sequence-parallel
         pp2_1f1b:2:--layers,2,--batch-size,8,--pp,2,--pp-schedule,1f1b
         pp2_zbv:2:--layers,4,--batch-size,4,--pp,2,--pp-schedule,zbv
         cp2_ring:2:--layers,2,--batch-size,8,--cp,2,--cp-mode,ring
         ep2_capacity:2:--layers,2,--batch-size,4,--ep,2,--capacity-factor,0.5,MOE
         moe_pp2_zbv:2:--layers,4,--batch-size,4,--pp,2,--pp-schedule,zbv,--moe-every,2,MOE
         nd16:16:--layers,2,--batch-size,4,--pp,2,--cp,2,--tp,2,--zero,2,--sequence-parallel,--recompute,selective"

passed=0 failed=0
for entry in $layouts; do
    IFS=: read -r name ranks flag_list <<<"$entry"
    if [[ $# -gt 0 && " $* " != *" $name "* ]]; then continue; fi
    IFS=, read -r -a flags <<<"$flag_list"
    if [[ ${flags[-1]} == MOE ]]; then    # a mixture of experts: the Llama block with experts
        unset 'flags[-1]'
        flags+=("${moe[@]}")
    fi
    for build in old new; do
        binary="$root/train_gpt_fp32_cpu"
        [[ $build == old ]] && binary="$work/old/train_gpt_fp32_cpu"
        mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${common[@]}" "${flags[@]}" \
            --output-dir "$work/$name.$build" >"$work/$name.$build.out" 2>&1 ||
            echo "  ($name: the $build build exited non-zero; see below)"
    done
    verdict=$(/usr/bin/python3 - "$work/$name.old/log.jsonl" "$work/$name.new/log.jsonl" 2>&1 <<'EOF'
import json, struct, sys
# measured times and what is computed from them (the pipeline's measured bubbles, the ranks' attention
# balance), and where each run wrote
TIMING = {"ms", "tokens_per_s", "mfu", "hfu", "time_s", "eta_s", "step_ms", "bubble", "step_ms_replayed",
          "bubble_replayed", "step_ms_replayed_synchronous", "bubble_replayed_synchronous", "stage_pass_ms",
          "step_ms_planned", "bubble_planned", "milliseconds",
          "max_over_min", "output-dir"}
def as_float32(value):
    return struct.unpack("f", struct.pack("f", value))[0] if isinstance(value, float) else value
def canonical(value):
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return as_float32(value)
def events(path):
    try:
        return [canonical(json.loads(line)) for line in open(path)]
    except (OSError, ValueError) as error:
        sys.exit(f"unreadable log {path}: {error}")
# the new build may add fields (a new flag in the config event, a new number in the step event): only the
# fields the old log has are compared, and the added ones are listed, by their path in the event
# A flag the new build no longer has is listed too: the layouts here give none (the new build would refuse it),
# so its default did not shape the run; any other field the new build lost differs.
added, removed = set(), set()
def old_fields_of(old, new, where):
    if isinstance(old, dict) and isinstance(new, dict):
        added.update(f"{where}.{k}" for k in new if k not in old)
        lost = [k for k in old if k not in new]
        if where == "config.flags":
            removed.update(f"{where}.{k}" for k in lost)
            for k in lost:
                del old[k]
        return {k: old_fields_of(old[k], new[k], f"{where}.{k}") for k in old if k in new} | \
               {k: "(missing)" for k in old if k not in new}
    return new
old, new = events(sys.argv[1]), events(sys.argv[2])
if len(old) != len(new):
    sys.exit(f"{len(old)} events before, {len(new)} after")
for i, (a, b) in enumerate(zip(old, new)):
    b = old_fields_of(a, b, a.get("event", "?"))
    if a != b:
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        sys.exit(f"event {i} ({a.get('event')}) differs in {keys}")
if added or removed:
    print(f"{len(old)} events equal in the old fields" +
          (f"; the new build adds {', '.join(sorted(added))}" if added else "") +
          (f"; it no longer has the flags {', '.join(sorted(removed))}" if removed else ""))
    sys.exit(0)
print(f"{len(old)} events equal")
EOF
)
    status=$?
    if [[ $status -eq 0 ]] && cmp -s "$work/$name.old/model.bin" "$work/$name.new/model.bin"; then
        passed=$((passed + 1)); echo "  ok   $name: model.bin identical, $verdict"
    else
        failed=$((failed + 1)); echo "  FAIL $name: ${verdict:-model.bin differs}"
        tail -3 "$work/$name.new.out" | sed 's/^/       /'
    fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
