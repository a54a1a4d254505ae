#!/usr/bin/env bash
# Fuzzes every reader of untrusted input (dev/fuzz/fuzz_readers.h) with libFuzzer under ASan and UBSan.
#   scripts/fuzz.sh [SECONDS_PER_READER] [READER...]      default 60 s each; readers: model shard tokenizer
#                                                         checkpoint flags (default all, one after another)
# Each reader starts from dev/fuzz/seeds/<reader>/ and keeps what it learns in build/fuzz/<reader>/corpus/,
# so a second run goes on where the first stopped. Inputs that crash, hang (-timeout=10 s per input) or
# use more than 2 GiB are written to build/fuzz/<reader>/ (crash-*, timeout-*, oom-*, leak-*), and
# libFuzzer stops that reader at the first one. Replay one with build/fuzz/fuzz_<reader> FILE; once the
# reader is fixed, pin it in dev/fuzz/regressions/<reader>/ with a .expect file (see
# dev/fuzz/test_fuzz_regressions.cu). Not part of make test: it needs clang, and finds things by chance.
set -u
cd "$(dirname "$0")/.."

seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
    echo "error: SECONDS_PER_READER must be a positive whole number, got '$seconds'" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))
all_readers=(model shard tokenizer checkpoint flags)
readers=("$@")
[[ $# -eq 0 ]] && readers=("${all_readers[@]}")
for reader in "${readers[@]}"; do
    if [[ " ${all_readers[*]} " != *" $reader "* ]]; then
        echo "error: no reader named '$reader' (known: ${all_readers[*]})" >&2
        exit 2
    fi
done

if ! command -v clang++ >/dev/null 2>&1; then
    echo "error: clang++ not found; libFuzzer comes with clang: install it with 'apt-get install clang'" >&2
    exit 1
fi
bash scripts/check_tools.sh cpu || exit 1
bash scripts/check_tools.sh mpi || exit 1  # parse_options includes the parallel headers, which include mpi.h

# -O0: at -O1 clang spends minutes optimizing the CPU build's kernels, which a reader never calls; the
# readers themselves are bounded by system calls, not by the code's speed.
flags=(-std=c++17 -O0 -g -DLLMC_CPU -DLLMC_FUZZ -fopenmp -Wall -Wno-unknown-pragmas
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
       $(mpicxx --showme:compile))
libraries=(-rdynamic -lboost_context -lopenblas $(mpicxx --showme:link))
mkdir -p build/fuzz

# libFuzzer finds the flag names by itself through its string-comparison hooks; a dictionary of them
# (read from the table in options.h) gets it there in seconds instead of minutes
grep -o 'add_[a-z]*("[a-z0-9-]*"' llmc/io/options.h | sed -E 's/.*\("([^"]*)"/"--\1"/' > build/fuzz/flags.dict
printf '"--help"\n"="\n"true"\n"false"\n' >> build/fuzz/flags.dict

stat_of() {  # stat_of NAME LOG: a number from libFuzzer's -print_final_stats lines
    sed -nE "s/^stat::$1: *([0-9]+).*/\1/p" "$2" | tail -n 1
}

summary=() findings=0
for reader in "${readers[@]}"; do
    binary=build/fuzz/fuzz_$reader
    if [[ ! -x $binary ]] ||
       [[ -n $(find llmc dev/fuzz \( -name '*.h' -o -name '*.cuh' -o -name fuzz_reader.cu \) -newer "$binary") ]]; then
        echo "=== building $binary"
        if ! clang++ "${flags[@]}" -DFUZZ_READER="\"$reader\"" -x c++ dev/fuzz/fuzz_reader.cu -o "$binary" \
                "${libraries[@]}"; then
            echo "error: building $binary failed" >&2
            exit 1
        fi
    fi
    out=build/fuzz/$reader
    mkdir -p "$out/corpus"
    extra=()
    [[ $reader == flags ]] && extra=(-dict=build/fuzz/flags.dict)
    echo "=== fuzzing $reader for $seconds s (log: $out/log.txt)"
    start=$SECONDS
    "$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$out/" "${extra[@]}" "$out/corpus" "dev/fuzz/seeds/$reader" > "$out/log.txt" 2>&1
    status=$?
    elapsed=$((SECONDS - start))
    runs=$(stat_of number_of_executed_units "$out/log.txt")
    rate=$(stat_of average_exec_per_sec "$out/log.txt")
    corpus=$(find "$out/corpus" -type f | wc -l)
    count() { find "$out" -maxdepth 1 -name "$1-*" | wc -l; }
    crashes=$(count crash) timeouts=$(count timeout) ooms=$(count oom) leaks=$(count leak)
    found=$((crashes + timeouts + ooms + leaks))
    findings=$((findings + found))
    if [[ $status -ne 0 && $found -eq 0 ]]; then
        echo "error: the $reader fuzzer exited with status $status without leaving an input; see $out/log.txt" >&2
        findings=$((findings + 1))
    fi
    summary+=("$(printf '%-11s %6s %12s %8s %7s %8s %9s %5s %6s' "$reader" "$elapsed" "${runs:-?}" "${rate:-?}" \
                 "$corpus" "$crashes" "$timeouts" "$ooms" "$leaks")")
    [[ $found -gt 0 ]] && ls "$out"/crash-* "$out"/timeout-* "$out"/oom-* "$out"/leak-* 2>/dev/null | sed 's/^/    /'
done

echo
printf '%-11s %6s %12s %8s %7s %8s %9s %5s %6s\n' reader seconds executions exec/s corpus crashes timeouts ooms leaks
printf '%s\n' "${summary[@]}"
# findings of earlier runs stay in build/fuzz/<reader>/ until removed, and are counted again
[[ $findings -eq 0 ]]
