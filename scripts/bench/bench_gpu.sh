#!/usr/bin/env bash
# GPU benchmark: GPT-2 124M training steps at B=16, T=1024 (BF16): tokens/s, MFU (the FLOP formula and
# the peak table are in llmc/planning/mfu.h) and the time per step of each kernel class (attention, matmuls, the
# rest). The first 3 steps are warm-up and not counted. Works on a fresh machine: without the corpus
# (make data) it trains on a shard of random tokens made here, and it writes no model file.
#   usage: scripts/bench/bench_gpu.sh [STEPS]      (default 20)
# Where the time per class comes from, best first:
#   - nsys (Nsight Systems) when installed: a second, profiled run; every kernel's GPU time, classified by
#     name and divided by the steps. Exact, and it sees the real step's kernels, cuBLASLt's included.
#   - the CPU build: its device's own profile (LLMC_CPU_PROFILE=1) of the timed run, classified the same way.
#   - otherwise an estimate from ./kernel_lab --bench: the attention and matmul rates (TFLOP/s) it measures
#     at GPT-2 124M shapes, applied to the FLOPs of one step; the rest is what remains of the measured step.
# For trying the plumbing on a small model or the CPU build, these override the defaults:
#   BENCH_BINARY=./train_gpt_cpu BENCH_MODEL="--model custom --layers 2 --heads 2 --channels 64"
#   BENCH_BATCH=2 BENCH_SEQ=32
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-20}
binary=${BENCH_BINARY:-./train_gpt}
read -r -a model <<<"${BENCH_MODEL:---model 124M}"
B=${BENCH_BATCH:-16}
T=${BENCH_SEQ:-1024}
python=$(command -v python3 || echo /usr/bin/python3)
if [[ $binary == ./train_gpt || $binary == ./train_gpt_cpu ]]; then
    make --no-print-directory -s "${binary#./}" >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

train_data="data/classics_train*.bin"
if compgen -G "$train_data" >/dev/null; then
    data_note="the default corpus"
else
    # llm.c's shard format (llmc/io/dataloader.h): 256 int32 header (magic, version, token count), uint16 tokens;
    # 4 batches of uniformly random ids below GPT-2's vocabulary size (the data does not change the speed)
    "$python" - "$work/random.bin" $((4 * B * T + 1)) <<'EOF'
import array, random, sys
path, count = sys.argv[1], int(sys.argv[2])
random.seed(1337)
header = array.array("i", [20240520, 1, count] + [0] * 253)
tokens = array.array("H", (random.randrange(50257) for _ in range(count)))
if sys.byteorder != "little":
    header.byteswap(), tokens.byteswap()
with open(path, "wb") as f:
    f.write(header.tobytes() + tokens.tobytes())
EOF
    train_data="$work/random.bin"
    data_note="random tokens (no corpus here)"
fi
run=("$binary" "${model[@]}" --batch-size "$B" --seq-len "$T" --train-data "$train_data" --val-every 0
     --sample-tokens 0 --checkpoint-every 0 --save-model false)

# ---- the timed run
profile=()
[[ $binary == *_cpu ]] && profile=(env LLMC_CPU_PROFILE=1)
"${profile[@]}" "${run[@]}" --steps "$steps" --output-dir "$work/timed" >"$work/timed.out" 2>"$work/timed.err" || {
    tail -n 5 "$work/timed.err" >&2
    echo "error: the benchmark run failed" >&2
    exit 1
}
skip=$((steps > 3 ? 3 : steps - 1))  # warm-up steps left out of the averages
step_ms=$(grep '"event": "step"' "$work/timed/log.jsonl" | tail -n +$((skip + 1)) |
    sed -E 's/.*"ms": ([0-9.e+-]+), "tokens_per_s": ([0-9.e+-]+), "memory_mib": ([0-9.e+-]+), "mfu": ([0-9.e+-]+|null).*/\1 \2 \3 \4/' |
    awk '{ ms += $1; tps += $2; mem = $3; if ($4 != "null") { mfu += $4; known = 1 } n += 1 }
         END { printf "%.3f %.0f %.0f %s\n", ms / n, tps / n, mem, known ? sprintf("%.1f%%", 100 * mfu / n) : "n/a" }')
read -r ms tokens_per_s memory mfu <<<"$step_ms"
echo "$(grep -m1 '^model:' "$work/timed.out" | sed 's/^model: //'), B=$B T=$T, on $data_note"
echo "$(grep -m1 '^train_gpt:' "$work/timed.out" | sed 's/^train_gpt: //'): $ms ms/step, $tokens_per_s tokens/s, MFU $mfu, $memory MiB in use (mean of $((steps - skip)) steps)"

# ---- time per kernel class
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n 1 || true)
if [[ $binary == *_cpu ]]; then
    source_note="the CPU device's profile of the timed run (LLMC_CPU_PROFILE), per step"
    # "  0.212 s   44.5%  name (launches)" -> "seconds name"
    sed -nE 's/^ +([0-9.]+) s +[0-9.]+% +(.*) \([0-9]+\)$/\1 \2/p' "$work/timed.err" >"$work/kernels.txt"
    kernel_steps=$steps
elif [[ -n $nsys ]]; then
    kernel_steps=$((steps < 10 ? steps : 10))
    source_note="nsys, a profiled run of $kernel_steps steps, GPU time per step"
    "$nsys" profile --trace=cuda --sample=none --cpuctxsw=none --force-overwrite=true -o "$work/profile" \
        "${run[@]}" --steps "$kernel_steps" --output-dir "$work/profiled" >/dev/null 2>&1 || true
    # the report's name changed over versions (cuda_gpu_kern_sum, formerly gpukernsum)
    "$nsys" stats --force-export=true --format csv --report cuda_gpu_kern_sum -o "$work/stats" "$work/profile.nsys-rep" \
        >/dev/null 2>&1 ||
        "$nsys" stats --format csv --report gpukernsum -o "$work/stats" "$work/profile.nsys-rep" >/dev/null 2>&1 || true
    if compgen -G "$work/stats_*.csv" >/dev/null; then
        "$python" - "$work"/stats_*.csv >"$work/kernels.txt" <<'EOF'
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    print(float(row["Total Time (ns)"]) * 1e-9, row["Name"])
EOF
    else
        echo "(nsys gave no kernel summary: falling back to ./kernel_lab --bench)"
        nsys=""
    fi
fi
if [[ $binary != *_cpu && -z $nsys && -n ${BENCH_MODEL:-} ]]; then
    echo "time per kernel class: not estimated (no nsys here, and the estimate knows only the default model)"
    exit 0
fi
if [[ $binary != *_cpu && -z $nsys ]]; then
    kernel_steps=0
    source_note="no nsys here: attention and matmuls from the rates ./kernel_lab --bench measures at 124M shapes"
    make --no-print-directory -s kernel_lab >/dev/null
    ./kernel_lab --only attention --bench >"$work/lab.txt"
    ./kernel_lab --only matmul --bench >>"$work/lab.txt"
fi
"$python" - "$work" "$kernel_steps" "$ms" "$B" "$T" "$source_note" "${model[@]}" <<'EOF'
import re, sys
work, kernel_steps, step_ms, B, T, note = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]


def kernel_class(name):
    if "attention" in name:
        return "attention"
    # cuBLASLt's kernels (gemm, nvjet, cutlass, xmma...), the CPU build's matmul, and the bias gradient
    if re.search(r"gemm|nvjet|cutlass|xmma|cublas|matmul|bias_gradient", name, re.I):
        return "matmuls"
    return "the rest"


print(f"time per kernel class ({note}):")
if kernel_steps > 0:
    totals = {"attention": 0.0, "matmuls": 0.0, "the rest": 0.0}
    for line in open(f"{work}/kernels.txt"):
        seconds, name = line.split(" ", 1)
        totals[kernel_class(name)] += float(seconds)
    in_kernels = sum(totals.values()) * 1e3 / kernel_steps
    for name, seconds in totals.items():
        ms = seconds * 1e3 / kernel_steps
        print(f"  {name:<10} {ms:9.3f} ms  {100 * ms / in_kernels if in_kernels else 0:5.1f}% of the kernel time")
    print(f"  {'kernels':<10} {in_kernels:9.3f} ms  per step over all {kernel_steps} steps, warm-up included; the "
          f"timed step took {step_ms:.3f} ms (host work and gaps between kernels make the difference)")
else:
    # GPT-2 124M (or the BENCH_MODEL shape: not parsed here, so only the default is supported)
    L, C, NH, Vp = 12, 768, 12, 50304
    BT, HS = B * T, C // NH
    rates = {}
    for line in open(f"{work}/lab.txt"):
        m = re.search(r"bench (attention_forward|attention_backward|matmul_forward|matmul_backward)\S*.*?"
                      r"([0-9.]+) ms.*?([0-9.]+) TFLOP/s", line)
        if m:
            flops, seconds = rates.get(m.group(1), (0.0, 0.0))
            ms, tflops = float(m.group(2)), float(m.group(3))
            rates[m.group(1)] = (flops + tflops * 1e12 * ms * 1e-3, seconds + ms * 1e-3)
    def rate(*keys):  # FLOPs / seconds over the lab's benchmarks of these kinds; 0 when it measured none
        flops = sum(rates.get(k, (0.0, 0.0))[0] for k in keys)
        seconds = sum(rates.get(k, (0.0, 0.0))[1] for k in keys)
        return flops / seconds if flops > 0 and seconds > 0 else 0.0
    attention_forward = 4.0 * B * NH * T * T * HS / 2  # causal, the lab's convention
    forward_rate, backward_rate = rate("attention_forward"), rate("attention_backward")
    matmul_rate = rate("matmul_forward", "matmul_backward")
    classes = {
        "attention": L * (attention_forward / forward_rate + 2.5 * attention_forward / backward_rate)
                     if forward_rate and backward_rate else None,
        # forward, and backward twice that (input and weight gradients), of the 4 matmuls per layer + the lm head
        "matmuls": 3 * 2.0 * B * T * (L * 12 * C * C + C * Vp) / matmul_rate if matmul_rate else None,
    }
    for name, seconds in classes.items():
        if seconds is None:
            print(f"  {name:<10}       n/a  (./kernel_lab --bench measured no rate for it)")
        else:
            print(f"  {name:<10} {seconds * 1e3:9.3f} ms  {100 * seconds * 1e3 / step_ms:5.1f}% of the step")
    if None not in classes.values():
        rest = step_ms - sum(classes.values()) * 1e3
        print(f"  {'the rest':<10} {rest:9.3f} ms  {100 * rest / step_ms:5.1f}% of the step (what remains of "
              f"{step_ms:.3f} ms)")
EOF
