#!/usr/bin/env bash
# Measures this machine and writes its profile for the planner (--plan --machine FILE; the format is
# llmc/planning/hardware.h's), with the fit of each collective's cost.
#   usage: scripts/bench/calibrate.sh [--quick] [--from MEASUREMENTS] [OUT]   (OUT default: build/machine.profile)
#     --quick   a coarse grid, 2 and 4 ranks, fewer calls: seconds, for the tests; the numbers are rougher
#     --from    measure nothing: fit the measurements of an earlier run (its OUT.measurements) again
# It keeps what it measured, one line per measurement, in OUT.measurements.
#
# What is measured (dev/calibrate.cu, built as calibrate_fp32_cpu here, calibrate on a GPU machine), each time
# through the project's own kernels and communication layer, the median of several calls after a warm-up:
#   matmuls       M, N, K each 64 .. 1024 in powers of 2 (quick: 64, 256, 1024; a GPU: 256 .. 8192) through the
#                 three calls the model makes of the matmul launcher (forward, backward input, backward weights: the
#                 same sgemm or cuBLASLt call with other operands transposed); a shape's row is its mean time over
#                 the three, so that the planner, which prices the three products of a layer by their shapes, gets
#                 each shape at the rate its calls average. peak_flops = the best rate of any call; each row's
#                 efficiency is relative to it. It prints how far the three calls' rates differ. The operands are
#                 random values (a GPU runs constant ones faster). A model's own shapes can be added to the
#                 measurements: `calibrate matmul M N K` prints one shape's line.
#   attention     causal attention_forward + attention_backward, head size 32 and 64, T = 16 .. 512 (quick: 32, 128;
#                 a GPU: head size 64 and 128, T = 128 .. 8192, 2^18 rows of 16 heads a call, a training step's size):
#                 efficiency = the flops the planner counts for it (hardware.h's attention_flops: the causal
#                 kernel's T^2/2 scores a head, 2 + 7 products each) per second / peak_flops, so that the planner's
#                 count over peak x efficiency is the kernel's time (above 1, written as 1 with a warning)
#   memory        streaming: residual_forward over buffers far beyond the caches: hbm_bytes_per_second (AdamW's
#                 rate); a block's memory-bound kernels by kind (layernorm and rmsnorm: each norm forward and
#                 backward; pointwise: GELU forward and backward, a residual add; route: a mixture's routing and
#                 its backward) on
#                 R = 128 .. 1024 rows of C = 128 .. 512 values (quick: R 128, 1024, C 128, 256), the bytes the
#                 planner counts over their time less their launches: the memory rows (the CPU build's emulated
#                 warps pay per row and barrier, not per byte)
#   launch        residual_forward on 16 bytes, launched many times: launch_seconds
#   copies        copy_to_device / copy_to_host with pinned host memory: pcie_bytes_per_second (the mean of the
#                 two directions' times)
#   collectives   all_reduce, all_gather, reduce_scatter, all_to_all, send_recv (a ring shift) over n = 8 B .. 32
#                 MiB in powers of 4 (quick: of 16, to 8 MiB), on G = 2, 3, 4, 6, 8 ranks (quick: 2, 4) under
#                 `mpirun --oversubscribe` as train_gpt's runs are started; per call the slowest rank's time.
# The CPU build's ranks are one process each, OMP_NUM_THREADS=1: a rank's "device" is one core (the compute
# numbers are one core's), and cores_per_node = nproc says how many ranks run at once.
#
# The fit. Per collective, alpha (seconds per step) and beta (bus bytes per second) of
#     seconds = stretch x (steps(op, ring, G) x alpha + factor(op, G) x n / beta),   stretch = max(1, G / cores)
# (steps and factor: hardware.h's collective_steps and collective_bus_factor) over every (G, n) measured, by least
# squares on log(seconds): every point counts by its relative error, so neither the bytes-sized calls (microseconds)
# nor the 32 MiB ones (tens of milliseconds) decide alone, and over- and under-estimates weigh alike. The minimum
# is found by a grid over log alpha x log beta that zooms in six times (plain python, no package needed).
# R2 is reported on log(seconds) too (1 - residual / total sum of squares of the logs), with the median and the
# worst ratio between fitted and measured time.
# Why the stretch: beyond one rank per core the ranks take turns on the cores, and every step of a collective waits
# for a rank that is not running. Measured here (2 cores, G = 2 .. 8), the stretched law fits better than the
# same law on every G: R2 0.82-0.91 against 0.71-0.83, median ratio x1.7-2.4 against x1.9-2.7 (each G alone:
# R2 0.85-0.99, median x1.1-1.7, alpha from ~1 us at G = 2 to 20-200 us at G = 8). So the profile's collective rows
# are a rank's costs when each rank has a core, and a planner prices a collective on a node whose ranks share its
# cores as collective_seconds / rank_compute_share(hw, ranks on the node): the same stretch as the compute's (the
# ranks on the node are the whole job's, not the group's). The fits of each G alone are printed, and written as
# comments, for comparison.
# Known on this host (OpenMPI 4.1): the reductions (all_reduce, reduce_scatter) switch algorithm between 2 and 8
# MiB and become ~10-50x slower per byte, a step that alpha + n/beta cannot follow (the same in a plain MPI
# program); and while other processes load the cores, calls of a few bytes sometimes take a scheduler slice
# (~16 ms) for a whole point. Both show as the worst ratios; R2 on log time and the median ratio stay honest.
#
# How long: full 3-4 minutes here (2 shared cores, others building; collectives of 32 MiB on 6 and 8 ranks take
# most of it), --quick 8-15 s, plus the build of calibrate_fp32_cpu (~20 s) when it is not built. Timings on a
# shared machine are noisy: calibrate on a quiet one.
# On a GPU machine (nvidia-smi lists GPUs) it builds `calibrate` (BF16, nvcc) and measures the GPU and NCCL on
# 2, 4, 8 ranks up to the GPUs it has (NCCL needs a GPU per rank): cores_per_node 0, ranks_per_node =
# ranks_per_leaf = the GPUs. With one GPU it measures the compute alone, and the profile's collective rows are the
# built-in h100's NVLink (node) rows, said so in the file: a one-GPU run never uses them.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage="usage: scripts/bench/calibrate.sh [--quick] [--from MEASUREMENTS] [OUT]"
quick=0
from=
out=build/machine.profile
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) quick=1 ;;
        --from)
            [[ $# -ge 2 && -f $2 ]] || { echo "error: --from needs an existing measurements file ($usage)" >&2; exit 1; }
            from=$2
            shift ;;
        -*) echo "error: unknown option '$1' ($usage)" >&2; exit 1 ;;
        *) out=$1 ;;
    esac
    shift
done
mkdir -p "$(dirname "$out")"

gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [[ $gpus -gt 0 ]]; then
    binary=./calibrate
    # NCCL needs a GPU per rank: one GPU measures no collective (the profile then borrows h100's NVLink rows)
    ranks=$(for g in 2 4 8; do [[ $g -le $gpus ]] && echo $g; done)
    cores=0
    ranks_per_node=$gpus
    name=gpu-$gpus
else
    binary=./calibrate_fp32_cpu
    if [[ $quick -eq 1 ]]; then ranks="2 4"; else ranks="2 3 4 6 8"; fi
    cores=$(nproc)
    ranks_per_node=1024  # every group of one host's ranks is in the node tier
    name=cpu-$(hostname | tr -c 'A-Za-z0-9_.\n-' '_')
    export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
    # OpenBLAS 0.3.21 does not recognise newer Intel cores (as in scripts/test/run_tests.sh)
    if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
fi
flags=()
[[ $quick -eq 1 ]] && flags=(--quick)
measurements=$out.measurements
if [[ -n $from ]]; then
    measurements=$from
    # the machine it measured, as its first lines say
    read -r _ _ name cores ranks_per_node < <(grep -m1 '^# machine ' "$from" || echo "# machine")
    [[ -n ${ranks_per_node:-} ]] || { echo "error: $from: no '# machine NAME CORES RANKS_PER_NODE' line" >&2; exit 1; }
else
    if ! make --no-print-directory -s "${binary#./}" >/dev/null; then
        [[ -x $binary ]] || { echo "error: no $binary, and make could not build it" >&2; exit 1; }
        echo "warning: make could not build $binary: measuring with the one already here" >&2
    fi
    start=$SECONDS
    {
        echo "# $binary ${flags[*]} on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ), ranks: $(echo $ranks)"
        echo "# machine $name $cores $ranks_per_node"
        "$binary" compute "${flags[@]}"
        for g in $ranks; do
            mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS -np "$g" "$binary" collectives "${flags[@]}" |
                grep '^collective '
        done
    } >"$measurements"
    echo "measured in $((SECONDS - start)) s: $measurements"
fi

/usr/bin/python3 - "$measurements" "$out" "$name" "$cores" "$ranks_per_node" <<'PYTHON'
import math, sys
from collections import defaultdict

measurements, out, name, cores, ranks_per_node = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]

matmuls, attention, collectives = [], [], defaultdict(list)
memory, stream, launch, copy = [], None, None, None
for line in open(measurements):
    w = line.split()
    if not w or w[0].startswith("#"):
        continue
    if w[0] == "collective":
        collectives[w[1]].append((int(w[2]), int(w[3]), float(w[4])))  # G n seconds
        continue
    if w[0] == "memory":                                # KIND C R bytes seconds
        memory.append((w[1], int(w[2]), int(w[3]), float(w[4]), float(w[5])))
        continue
    v = [float(x) for x in w[1:]]
    if w[0] == "matmul": matmuls.append(v)              # M N K forward input weights
    elif w[0] == "attention": attention.append(v)       # T B NH HS seconds flops
    elif w[0] == "stream": stream = v                   # bytes seconds
    elif w[0] == "launch": launch = v[0]
    elif w[0] == "copy": copy = v                       # bytes to_device to_host
missing = [k for k, x in (("matmul", matmuls), ("memory", memory), ("stream", stream), ("launch", launch), ("copy", copy)) if not x]
# one GPU measures no collective: h100's node rows stand in (llmc/planning/h100_profile.h), written as borrowed
borrowed = not collectives and cores == 0 and ranks_per_node == 1
if borrowed:
    h100 = open("llmc/planning/h100_profile.h").read()
    borrowed_rows = [line.split("#")[0].split() for line in h100.splitlines() if line.startswith("collective node ")]
else:
    missing += [op for op in OPS if not collectives[op]]
if missing:
    sys.exit("error: %s: no %s measurements" % (measurements, ", ".join(missing)))

def positive(what, x):
    if not (x > 0 and math.isfinite(x)):
        sys.exit("error: %s: %s is %r, not a positive number" % (measurements, what, x))
    return x

# ---- compute: peak = the best single call; a shape's rate from its three calls' mean time
peak = max(2 * m * n * k / t for m, n, k, *times in matmuls for t in times)
rows = [(m, n, k, 2 * m * n * k / (sum(times) / 3) / peak) for m, n, k, *times in matmuls]
spread = max(max(times) / min(times) for m, n, k, *times in matmuls)
geo = [math.exp(sum(math.log(2 * m * n * k / times[i]) for m, n, k, *times in matmuls) / len(matmuls)) for i in range(3)]
hbm = positive("streaming bandwidth", stream[0] / stream[1])
memory_rows = [(kind, c, r, positive("%s memory rate at width %d, %d rows" % (kind, c, r), b / t))
               for kind, c, r, b, t in sorted(memory)]
pcie = positive("copy bandwidth", 2 * copy[0] / (copy[1] + copy[2]))
launch = positive("launch seconds", launch)
attention_rows = [(t, hs, flops / seconds / peak) for t, b, nh, hs, seconds, flops in sorted(attention, key=lambda a: (a[3], a[0]))]
for t, hs, e in attention_rows:
    if e > 1: print("warning: attention at T %d, head size %d runs at %.2f of peak as the planner counts it: written as 1" % (t, hs, e))
attention_rows = [(t, hs, min(e, 1.0)) for t, hs, e in attention_rows]

# ---- collectives
def steps(op, g): return 1 if op == "send_recv" else 2 * (g - 1) if op == "all_reduce" else g - 1
def factor(op, g): return 1.0 if op == "send_recv" else (2.0 if op == "all_reduce" else 1.0) * (g - 1) / g
def stretch(g): return max(1.0, g / cores) if cores > 0 else 1.0

def fit(points, op, law):
    """alpha, beta minimising sum (log predicted - log measured)^2; law(g) multiplies the whole cost"""
    logs = [(law(g) * steps(op, g), law(g) * factor(op, g) * n, math.log(t)) for g, n, t in points]
    la, lb = (math.log(1e-10), math.log(1e-1)), (math.log(1e5), math.log(1e14))
    best = None
    for _ in range(6):
        cells = 24
        for i in range(cells + 1):
            log_alpha = la[0] + (la[1] - la[0]) * i / cells
            alpha = math.exp(log_alpha)
            for j in range(cells + 1):
                log_beta = lb[0] + (lb[1] - lb[0]) * j / cells
                inverse_beta = math.exp(-log_beta)
                s = sum((math.log(x1 * alpha + x2 * inverse_beta) - lt) ** 2 for x1, x2, lt in logs)
                if best is None or s < best[0]: best = (s, log_alpha, log_beta)
        wa, wb = 2 * (la[1] - la[0]) / cells, 2 * (lb[1] - lb[0]) / cells
        la, lb = (best[1] - wa, best[1] + wa), (best[2] - wb, best[2] + wb)
    return math.exp(best[1]), math.exp(best[2])

def quality(points, op, law, alpha, beta):
    """R2 on log seconds, median and worst ratio of fitted to measured (>= 1 either way)"""
    logs = [math.log(t) for g, n, t in points]
    predicted = [math.log(law(g) * (steps(op, g) * alpha + factor(op, g) * n / beta)) for g, n, t in points]
    mean = sum(logs) / len(logs)
    total = sum((x - mean) ** 2 for x in logs)
    r2 = 1 - sum((x - p) ** 2 for x, p in zip(logs, predicted)) / total if total > 0 else 1.0
    ratios = sorted(math.exp(abs(x - p)) for x, p in zip(logs, predicted))
    return r2, ratios[len(ratios) // 2], ratios[-1]

fits, per_g = {}, {}
if not borrowed:  # the fits of what was measured
    print("\ncollectives: seconds = stretch x (steps x alpha + factor x n / beta), stretch = max(1, G / %d cores)" % cores)
    print("fitted by least squares on log(seconds) over every (G, n); R2 on log(seconds); ratio = fitted vs measured")
    print("%-15s %11s %13s %7s %7s %9s %9s" % ("collective", "alpha (s)", "beta (B/s)", "R2", "points", "median x", "worst x"))
    for op in OPS:
        points = collectives[op]
        alpha, beta = fit(points, op, stretch)
        r2, median, worst = quality(points, op, stretch, alpha, beta)
        fits[op] = (alpha, beta, r2, len(points))
        print("%-15s %11.3e %13.3e %7.3f %7d %9.2f %9.1f" % (op, alpha, beta, r2, len(points), median, worst))
        for g in sorted({g for g, n, t in points}):
            alone = [p for p in points if p[0] == g]
            a, b = fit(alone, op, lambda g: 1.0)
            per_g[op, g] = (a, b) + quality(alone, op, lambda g: 1.0, a, b)
        plain = fit(points, op, lambda g: 1.0)
        fits[op] += (quality(points, op, lambda g: 1.0, *plain),)
    print("\nwithout the stretch (the same law on every G), and each G alone (no stretch):")
    print("%-15s %5s %11s %13s %7s %9s %9s" % ("collective", "G", "alpha (s)", "beta (B/s)", "R2", "median x", "worst x"))
    for op in OPS:
        r2, median, worst = fits[op][4]
        print("%-15s %5s %11s %13s %7.3f %9.2f %9.1f" % (op, "all", "", "", r2, median, worst))
        for (o, g), (a, b, r2, median, worst) in sorted(per_g.items()):
            if o == op: print("%-15s %5d %11.3e %13.3e %7.3f %9.2f %9.1f" % ("", g, a, b, r2, median, worst))

print("\nmatmuls: peak %.3e FLOP/s (best call), %d shapes, efficiency %.3f .. %.3f; the three calls' rates "
      "(geometric mean over shapes): forward %.3e, backward input %.3e, backward weights %.3e; worst spread "
      "between them on one shape x%.2f" % (peak, len(rows), min(r[3] for r in rows), max(r[3] for r in rows),
                                           geo[0], geo[1], geo[2], spread))
print("attention: " + ", ".join("T %d HS %d %.4f" % row for row in attention_rows) + " of peak")
print("memory: streaming %.3e B/s; host copies %.3e B/s, launch %.3e s; a block's kernels by kind, B/s:" % (hbm, pcie, launch))
for kind in sorted(set(k for k, *_ in memory_rows)):
    print("  %-9s " % kind + ", ".join("C %d R %d %.3g" % (c, r, rate) for k, c, r, rate in memory_rows if k == kind))

lines = ["llmc machine profile 1",
         "# written by scripts/bench/calibrate.sh from %s" % measurements,
         "# collective rows: a rank's costs when every rank has a core; with R ranks on a node of cores_per_node",
         "# cores (R > cores) every cost stretches by R / cores_per_node (1 / rank_compute_share), collectives too",
         "name %s" % name,
         "peak_flops %.6e" % peak,
         "hbm_bytes_per_second %.6e" % hbm,
         "pcie_bytes_per_second %.6e" % pcie,
         "launch_seconds %.6e" % launch,
         "ranks_per_node %d" % ranks_per_node,
         "ranks_per_leaf %d" % ranks_per_node,
         "cores_per_node %d" % cores]
lines += ["matmul %d %d %d %.4f" % (m, n, k, e) for m, n, k, e in rows]
lines += ["attention %d %d %.6f" % row for row in attention_rows]
lines += ["memory %s %d %d %.6e" % row for row in memory_rows]
if borrowed:
    lines.append("# collective rows: not measured (one GPU, and NCCL needs one a rank): the built-in h100's NVLink rows")
    lines += [" ".join(row) for row in borrowed_rows]
for op in OPS if not borrowed else []:
    alpha, beta, r2, points, _ = fits[op]
    lines.append("collective node %s ring %.6e %.6e" % (op, alpha, beta))
for op in OPS if not borrowed else []:
    alpha, beta, r2, points, _ = fits[op]
    lines.append("fit %s ring %.4f %d" % (op, r2, points))
lines.append("# each G alone, no stretch: OP G ALPHA BETA R2")
for (op, g), (a, b, r2, median, worst) in sorted(per_g.items()):
    lines.append("# %s %d %.3e %.3e %.3f" % (op, g, a, b, r2))
for what, x in [("peak_flops", peak)] + [("fit", f[0]) for f in fits.values()] + [("fit", f[1]) for f in fits.values()]:
    positive(what, x)
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\nwrote %s" % out)
PYTHON
