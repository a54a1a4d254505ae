#!/usr/bin/env bash
# scripts/bench/calibrate.sh --quick (2 and 4 ranks, a coarse grid) into a scratch directory: the profile has every
# key the format requires, every number positive and finite, rates that a CPU core can have, a fit and an R2
# printed and written for each collective, and train_gpt plans with it (--plan 4 --machine PROFILE).
#   usage: scripts/test/test_calibrate.sh [TRAIN_BINARY]      (default ./train_gpt_fp32_cpu)
# About 15 s on 2 cores (plus the build of calibrate_fp32_cpu, ~20 s, when it is not built).
set -u
cd "$(dirname "$0")/../.."
source scripts/test/test_lib.sh
binary=${1:-./train_gpt_fp32_cpu}
profile=$work/machine.profile

if ! bash scripts/bench/calibrate.sh --quick "$profile" >"$work/calibrate.out" 2>&1; then
    bad "calibrate.sh --quick exited non-zero: $(tail -n 5 "$work/calibrate.out")"
    finish
    exit
fi
ok "calibrate.sh --quick wrote $profile ($(wc -l <"$profile") lines)"

# value KEY: the profile's number for a one-number key
value() { awk -v key="$1" '$1 == key { print $2 }' "$profile"; }

[[ $(head -n 1 "$profile") == "llmc machine profile 1" ]] && ok "first line" || bad "first line: $(head -n 1 "$profile")"
for key in name peak_flops hbm_bytes_per_second pcie_bytes_per_second launch_seconds ranks_per_node ranks_per_leaf \
    cores_per_node; do
    count=$(awk -v key="$key" '$1 == key' "$profile" | wc -l)
    [[ $count -eq 1 ]] && ok "$key $(value "$key")" || bad "$key given $count times"
done
[[ $(value cores_per_node) == "$(nproc)" && $(value ranks_per_node) -ge 8 && $(value ranks_per_leaf) -ge 8 ]] &&
    ok "one host: cores_per_node = nproc, ranks_per_node and ranks_per_leaf hold every rank" ||
    bad "cores_per_node $(value cores_per_node) (nproc $(nproc)), ranks_per_node $(value ranks_per_node)"

# every number of every row positive and finite; efficiencies in (0, 1]; the quick grid's 27 shapes, 2 lengths
/usr/bin/python3 - "$profile" >"$work/rows.out" <<'EOF'
import math, sys
good = bad = 0
def check(name, condition, detail=""):
    global good, bad
    print("  %s %s %s" % ("ok  " if condition else "FAIL", name, detail))
    good, bad = good + condition, bad + (not condition)
rows = {"matmul": [], "attention": [], "memory": [], "collective": [], "fit": []}
numbers_ok, words, hbm = True, 0, []
for line in open(sys.argv[1]):
    w = line.split("#")[0].split()
    if not w or w[0] not in rows and w[0] not in ("peak_flops", "hbm_bytes_per_second", "pcie_bytes_per_second",
                                                  "launch_seconds", "cores_per_node"):
        continue
    values = [float(x) for x in w[1:] if x not in ("node", "ring") and not x.replace("_", "").isalpha()]
    # R2 may be negative in principle; everything else must be a positive finite number
    checked = values[:-2] + values[-1:] if w[0] == "fit" else values
    numbers_ok = numbers_ok and all(math.isfinite(v) for v in values) and all(v > 0 for v in checked)
    words += len(values)
    if w[0] in rows: rows[w[0]].append(w[1:])
    if w[0] == "hbm_bytes_per_second": hbm = w[1:]
check("every number positive and finite", numbers_ok, "(%d numbers)" % words)
efficiencies = [float(r[3]) for r in rows["matmul"]] + [float(r[2]) for r in rows["attention"]]
check("matmul and attention efficiencies in (0, 1]", all(0 < e <= 1 for e in efficiencies),
      "%.3g .. %.3g" % (min(efficiencies), max(efficiencies)))
check("the quick grid: 27 matmul shapes, attention at 2 lengths x head sizes 32 and 64",
      len(rows["matmul"]) == 27 and sorted((float(r[0]), float(r[1])) for r in rows["attention"]) ==
          sorted((t, hs) for t in (32, 128) for hs in (32, 64)),
      "%d shapes, attention %s" % (len(rows["matmul"]), " ".join("%s/%s" % (r[0], r[1]) for r in rows["attention"])))
grid = sorted((r[0], float(r[1]), float(r[2])) for r in rows["memory"])
expected = sorted((k, c, n) for k in ("layernorm", "pointwise", "rmsnorm", "route") for c in (128, 256) for n in (128, 1024))
check("memory rows: each kind (pointwise, layernorm, rmsnorm, route) at the quick widths 128, 256 and rows 128, 1024, each a rate "
      "below the streaming one",
      grid == expected and all(float(r[3]) <= float(stream) for r in rows["memory"] for stream in hbm),
      " ".join("%s:%s:%s:%s" % tuple(r) for r in rows["memory"]))
ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
check("a node ring row and a fit row for each collective",
      sorted(r[1] for r in rows["collective"] if r[0] == "node" and r[2] == "ring") == sorted(ops) and
      sorted(r[0] for r in rows["fit"] if r[1] == "ring") == sorted(ops))
# quick: 2 and 4 ranks x sizes 8 B .. 8 MiB in powers of 16 = 12 points per collective
check("each fit over 12 points (2 and 4 ranks, 6 sizes)", len(rows["fit"]) == 5 and all(r[3] == "12" for r in rows["fit"]),
      " ".join(r[0] + ":" + r[3] for r in rows["fit"]))
check("each R2 at most 1", len(rows["fit"]) == 5 and all(float(r[2]) <= 1 for r in rows["fit"]), " ".join(r[2] for r in rows["fit"]))
print("RESULT %d %d" % (good, bad))
EOF
cat "$work/rows.out"
add_python_result "$work/rows.out"

# the table printed: a line per collective with alpha, beta, R2 and its points
for op in all_reduce all_gather reduce_scatter all_to_all send_recv; do
    line=$(grep -E "^$op +[0-9.e+-]+ +[0-9.e+-]+ +-?[0-9.]+ +12 " "$work/calibrate.out")
    [[ -n $line ]] && ok "fit printed: $line" || bad "no fit line for $op in the output"
done

# Plausible for one core. peak_flops is one rank's, and a rank is one core running OpenBLAS's sgemm
# (OMP_NUM_THREADS=1): a core of this decade does 1e9 .. 2e11 FLOP/s in fp32 (AVX-512: 2 FMA units x 16 lanes x 2
# flops x ~3 GHz = 1.9e11); the bounds 1e8 .. 1e13 leave an order of magnitude or two for a slow or busy machine and
# still catch a time in the wrong unit (x1000). A core streams 1e9 .. 1e11 B/s from memory (bounds 1e8 .. 1e12), the
# host copy is a memcpy here (the same bounds), a launch on the CPU device costs microseconds (1e-8 .. 1e-2 s).
# And against a peer measured in the same run: the matmul is compute-bound and the residual add memory-bound, so a
# core's matmul does more flops per second than the add streams floats (4 bytes) per second (measured here: ~1e11
# FLOP/s against ~5e9 floats/s); a matmul rate counted per call instead of per second, or bytes counted as floats,
# breaks it.
within() { awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x > lo && x < hi) }'; }
peak=$(value peak_flops) hbm=$(value hbm_bytes_per_second) pcie=$(value pcie_bytes_per_second) launch=$(value launch_seconds)
within "$peak" 1e8 1e13 && ok "peak_flops $peak within 1e8 .. 1e13 (one core)" || bad "peak_flops $peak"
within "$hbm" 1e8 1e12 && ok "hbm_bytes_per_second $hbm within 1e8 .. 1e12" || bad "hbm_bytes_per_second $hbm"
within "$pcie" 1e8 1e12 && ok "pcie_bytes_per_second $pcie within 1e8 .. 1e12" || bad "pcie_bytes_per_second $pcie"
within "$launch" 1e-8 1e-2 && ok "launch_seconds $launch within 1e-8 .. 1e-2" || bad "launch_seconds $launch"
awk -v p="$peak" -v h="$hbm" 'BEGIN { exit !(p > h / 4) }' &&
    ok "the matmul's FLOP/s ($peak) above the residual add's floats/s ($hbm B/s / 4)" || bad "peak $peak vs memory $hbm"

# the planner reads it: --plan with the profile exits 0, for a small GPT-2 of the kind the planner's comparison runs
model=(--model custom --layers 2 --heads 4 --channels 128 --vocab-size 1024 --max-seq-len 64 --seq-len 64 --batch-size 4)
if "$binary" "${model[@]}" --plan 4 --machine "$profile" >"$work/plan.out" 2>&1; then
    ok "$binary --plan 4 --machine PROFILE exits 0 ($(grep -c . "$work/plan.out") lines)"
else
    bad "$binary --plan 4 --machine PROFILE: $(tail -n 3 "$work/plan.out")"
fi
# and plans with its numbers: a core is some 10^4 times slower than the built-in H100, so the estimated step is longer
"$binary" "${model[@]}" --plan 4 >"$work/plan_h100.out" 2>&1
estimate() { sed -nE 's/^estimated step ([0-9.e+-]+) s.*/\1/p' "$1"; }
calibrated=$(estimate "$work/plan.out") h100=$(estimate "$work/plan_h100.out")
awk -v c="${calibrated:-0}" -v h="${h100:-inf}" 'BEGIN { exit !(c > h) }' &&
    ok "the estimated step with this machine's profile ($calibrated s) longer than with the H100's ($h100 s)" ||
    bad "estimated step: this machine's profile '$calibrated' s, the H100's '$h100' s"
# one shape on its own (what a GPU session measures at a model's own shapes): one matmul line of three positive
# times; a shape that is not three whole numbers from 1 is refused in one line
line=$(./calibrate_fp32_cpu matmul 64 32 16 2>&1)
[[ $line =~ ^matmul\ 64\ 32\ 16(\ [0-9.]+e[-+][0-9]+){3}$ ]] && ok "calibrate matmul 64 32 16: $line" ||
    bad "calibrate matmul 64 32 16: $line"
for shape in "64 0 16" "64 32" "64 32 x"; do
    if out=$(./calibrate_fp32_cpu matmul $shape 2>&1); then
        bad "calibrate matmul $shape accepted: $out"
    else
        [[ $(grep -c . <<<"$out") -eq 1 && $out == error:*matmul* ]] && ok "calibrate matmul $shape refused: $out" ||
            bad "calibrate matmul $shape: $out"
    fi
done
# One GPU measures no collective (NCCL needs a GPU a rank): the fit of compute lines alone from a machine of one
# rank and no cores writes the built-in h100's NVLink rows, said so, and the planner reads the profile
{ echo "# machine gpu-1 0 1"; grep -v -e '^collective ' -e '^# machine ' "$profile.measurements"; } >"$work/one_gpu.measurements"
if bash scripts/bench/calibrate.sh --from "$work/one_gpu.measurements" "$work/one_gpu.profile" >"$work/one_gpu.out" 2>&1; then
    borrowed=$(grep -c '^collective node ' "$work/one_gpu.profile")
    h100_rows=$(grep -c '^collective node ' llmc/planning/h100_profile.h)
    [[ $borrowed -eq $h100_rows && $borrowed -gt 0 ]] && grep -q "not measured (one GPU" "$work/one_gpu.profile" &&
        ! grep -q '^fit ' "$work/one_gpu.profile" &&
        ok "one GPU: the profile borrows h100's $h100_rows node rows, says so, and has no fit" ||
        bad "one GPU: $borrowed node rows (h100 has $h100_rows), fit rows $(grep -c '^fit ' "$work/one_gpu.profile")"
    "$binary" "${model[@]}" --plan 1 --machine "$work/one_gpu.profile" >"$work/one_gpu_plan.out" 2>&1 &&
        ok "one GPU: --plan 1 reads its profile" || bad "one GPU: --plan 1: $(tail -n 2 "$work/one_gpu_plan.out")"
else
    bad "calibrate.sh --from, one GPU's measurements: $(tail -n 3 "$work/one_gpu.out")"
fi
# and a broken profile is refused (the same file without its peak_flops line)
grep -v '^peak_flops' "$profile" >"$work/broken.profile"
if "$binary" "${model[@]}" --plan 4 --machine "$work/broken.profile" >"$work/broken.out" 2>&1; then
    bad "a profile without peak_flops was accepted"
else
    message=$(cat "$work/broken.out")
    [[ $(grep -c . "$work/broken.out") -eq 1 && $message == error:*broken.profile*peak_flops* ]] &&
        ok "a profile without peak_flops refused: $message" || bad "a profile without peak_flops: $message"
fi
finish
