#!/usr/bin/env bash
# Proves the kernel lab can fail: deletes one barrier at a time from a kernel header, rebuilds the CPU
# lab in a scratch copy of the tree, and runs that family in both lane orders. Every deletion should be
# caught (the lab exits non-zero); the script prints one line per barrier and a closing count.
#   usage: scripts/test/mutate_barriers.sh llmc/kernels/attention.cuh attention
set -u
header=$1 family=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
caught=0 missed=0
mapfile -t lines < <(grep -n -E '__syncthreads\(\)|__syncwarp\(\)' "$root/$header" | cut -d: -f1)
for line in "${lines[@]}"; do
    rm -rf "$scratch/tree" && mkdir -p "$scratch/tree" && cp -r "$root/llmc" "$root/dev" "$scratch/tree/"
    # remove the call on that line only (the comment after it stays)
    sed -i -E "${line}s/__sync(threads|warp)\(\);//" "$scratch/tree/$header"
    g++ -std=c++17 -O1 -DLLMC_CPU -fopenmp -x c++ "$scratch/tree/dev/lab/kernel_lab.cu" -o "$scratch/lab" \
        -rdynamic -lboost_context -lopenblas -fopenmp 2>/dev/null || { echo "line $line: build failed"; continue; }
    failures=0
    for reverse in 0 1; do
        LLMC_CPU_REVERSE_LANES=$reverse timeout 300 "$scratch/lab" --only "$family" >/dev/null 2>&1 || failures=$((failures + 1))
    done
    code=$(sed -n "${line}p" "$root/$header" | sed -E 's/^ +//' | cut -c1-70)
    if [[ $failures -gt 0 ]]; then
        caught=$((caught + 1)); echo "caught ($failures of 2 lane orders)  $header:$line  $code"
    else
        missed=$((missed + 1)); echo "MISSED                           $header:$line  $code"
    fi
done
echo "$caught passed, $missed failed"
[[ $missed -eq 0 ]]
