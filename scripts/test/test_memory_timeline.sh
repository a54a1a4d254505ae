#!/usr/bin/env bash
# The memory timeline that --trace writes beside the pipeline's actions (llmc/parallel/pipeline_timeline.h): one
# rank, pp 2 under 1f1b (m 4) and pp 2 under zb-h1 (weight records), 2 steps of a 2-layer model (CPU build, FP32).
# For each: counter events for every pp rank, with every category a rank holds; at every moment of the step the
# categories add up to the same total (the books are flat over a step), and at the collection after it to more
# (the room of the timeline's gather); the stage records all idle at the step's start and
# end and, under 1f1b, held at most as many as the schedule's peak of records in flight (the run's "pipeline"
# event); rank 0's peak equal to the memory report's (log.jsonl's "memory" peak_bytes, memory_totals().peak_total)
# to the byte; and scripts/memory_timeline.py drawing the trace and printing that same peak. The runs save no
# model: the whole model gathered at the end of a run over several ranks would sit on top of the step's books.
#   usage: scripts/test/test_memory_timeline.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1

flags=(--model custom --layers 2 --heads 4 --channels 64 --seq-len 16 --max-seq-len 32 --total-batch-size 128
       --steps 2 --val-every 0 --sample-tokens 0 --save-model false)
for layout in "one:1:8:" "pp2_1f1b:2:2:--pp,2,--pp-schedule,1f1b" "pp2_zbh1:2:2:--pp,2,--pp-schedule,zb-h1"; do
    IFS=: read -r name ranks batch layout_flags <<<"$layout"
    if ! mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" --batch-size "$batch" \
        --trace "$work/$name.json" --output-dir "$work/$name" ${layout_flags//,/ } >"$work/$name.out" 2>&1; then
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
        continue
    fi
    if /usr/bin/python3 scripts/memory_timeline.py "$work/$name.json" -o "$work/$name.png" >"$work/$name.script" 2>&1 &&
        [[ -s $work/$name.png ]]; then
        ok "$name: scripts/memory_timeline.py drew it: $(grep -m1 'rank 0: device' "$work/$name.script")"
    else
        bad "$name: scripts/memory_timeline.py failed: $(tail -1 "$work/$name.script")"
    fi
done

/usr/bin/python3 - "$work" >"$work/check.out" <<'EOF' || true
import json, re, sys
work = sys.argv[1]
passed = failed = 0


def report(good, words):
    global passed, failed
    passed, failed = passed + good, failed + (not good)
    print(f"  {'ok  ' if good else 'FAIL'} {words}")


def log_event(name, event):
    found = [json.loads(line) for line in open(f"{work}/{name}/log.jsonl") if f'"event": "{event}"' in line]
    return found[-1] if found else None


for name, ranks in (("one", 1), ("pp2_1f1b", 2), ("pp2_zbh1", 2)):
    try:
        trace = json.load(open(f"{work}/{name}.json"))
    except (OSError, ValueError) as error:
        report(False, f"{name}: no trace ({error})")
        continue
    counters = {}
    for e in trace["traceEvents"]:
        match = re.match(r"device memory, rank (\d+)$", e.get("name", "")) if e.get("ph") == "C" else None
        if match:
            counters.setdefault(int(match.group(1)), []).append((e["ts"], e["args"]))
    expected = {"parameters", "gradients", "optimizer state", "workspace", "records", "records, idle"}
    missing = {r: sorted(expected - set(samples[0][1])) for r, samples in counters.items()}
    report(sorted(counters) == list(range(ranks)) and not any(missing.values()),
           f"{name}: device memory counters for pp ranks {sorted(counters)} of {ranks}, "
           f"{len(trace['traceEvents'])} events; categories missing: {missing}")
    pipeline = log_event(name, "pipeline")
    for r, samples in sorted(counters.items()):
        # the step's samples, then the collection's (its gather's room booked on top)
        totals = {sum(args.values()) for _, args in samples[:-1]}
        collected = sum(samples[-1][1].values())
        records = [args["records"] for _, args in samples]
        one_record = min((b for b in records if b > 0), default=0)
        held = max(records) // one_record if one_record else 0
        words = (f"{name}, rank {r}: {len(samples)} samples, totals {sorted(totals)} in the step, {collected} at the "
                 f"collection; records held {records[0]} at the start, {records[-2]} at the end, at most {max(records)} B")
        good = (len(totals) == 1 and collected > min(totals) and records[0] == 0 and records[-2] == 0 and
                records[-1] == 0 and max(records) > 0)
        if name == "pp2_1f1b":  # records of one size only: count them against the schedule's peak in flight
            peak = pipeline["peak_records"][r]
            good = good and max(records) == held * one_record and held == peak
            words += f" = {held} records (the schedule's peak in flight: {peak})"
        report(good, words)
    if 0 in counters:
        timeline_peak = max(sum(args.values()) for _, args in counters[0])
        memory = log_event(name, "memory")
        report(memory is not None and timeline_peak == memory["peak_bytes"],
               f"{name}: rank 0's timeline peak {timeline_peak} B, the memory report's peak "
               f"{memory and memory['peak_bytes']} B")
        printed = re.search(r"rank 0: device memory peak (\d+) bytes", open(f"{work}/{name}.script").read())
        report(printed is not None and int(printed.group(1)) == timeline_peak,
               f"{name}: the script printed rank 0's peak {printed and printed.group(1)} B")
print(f"RESULT {passed} {failed}")
EOF
grep -v '^RESULT' "$work/check.out"
add_python_result "$work/check.out"
finish
