#!/usr/bin/env bash
# Proves scripts/test/test_streams.sh can fail: deletes one cudaStreamWaitEvent at a time from llmc/, rebuilds
# the FP32 CPU trainer in a scratch copy of the tree, and runs the streams test with late streams
# (LLMC_CPU_LATE_STREAMS modes 1 and 2) and without (in issue order). A deleted wait should fail the
# first and pass the second: the CPU device's default in-order execution cannot see it. One line per
# wait and a closing count. Slow (a build and three passes of the test per wait, a few minutes each on
# 2 cores): not part of `make test`.
# PATTERN (an extended regular expression) limits the deletions to the sites whose "file:line:code" matches it,
# e.g. 'zero.h' or 'offload'.
#   usage: scripts/test/mutate_waits.sh [PATTERN]
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/base"  # a snapshot, so that edits made meanwhile do not leak into the runs
cp -r "$root/llmc" "$root/scripts" "$root/Makefile" "$root/train_gpt.cu" "$scratch/base/"
caught=0 missed=0
pattern=${1:-.}
mapfile -t sites < <(cd "$scratch/base" && grep -n -E 'cudaCheck\(cudaStreamWaitEvent\(' llmc/*/*.h llmc/*/*.cuh |
                     grep -E -- "$pattern" | cut -d: -f1,2)
for site in "${sites[@]}"; do
    file=${site%%:*} line=${site##*:}
    rm -rf "$scratch/tree" && cp -r "$scratch/base" "$scratch/tree" && ln -s "$root/data" "$scratch/tree/data"
    sed -i -E "${line}s/cudaCheck\(cudaStreamWaitEvent\([^;]*;//" "$scratch/tree/$file"
    code=$(sed -n "${line}p" "$scratch/base/$file" | sed -E 's/^ +//' | cut -c1-80)
    if ! (cd "$scratch/tree" && make train_gpt_fp32_cpu >"$scratch/build.out" 2>&1); then
        echo "$file:$line: build failed"; missed=$((missed + 1)); continue
    fi
    summary() {  # summary MODES: which checks failed, in one line
        (cd "$scratch/tree" && LATE_STREAMS_MODES="$1" bash scripts/test/test_streams.sh ./train_gpt_fp32_cpu 2>&1) |
            awk '/^LLMC_CPU_LATE_STREAMS=/ { mode = substr($1, 23) } /FAIL/ { failing = failing " " $2 "(" mode ")" }
                 /passed, [0-9]+ failed/ { print $0 (failing ? ":" failing : "") }'
    }
    late=$(summary "1 2")
    in_order=$(summary 0)
    if [[ $late != *" 0 failed"* ]]; then
        caught=$((caught + 1)); echo "caught  $file:$line  $code"
    else
        missed=$((missed + 1)); echo "MISSED  $file:$line  $code"
    fi
    echo "        late: $late"
    echo "        in issue order: $in_order"
done
echo "$caught passed, $missed failed"
[[ $missed -eq 0 ]]
